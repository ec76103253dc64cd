"""Weights on nodes, as placement reads them: a node holding a model's weights wins and its disk is not
charged again; a shared filer is one pool of free bytes (counted once across its nodes) and its weights are
on every node mounting it; the weights cache's own filesystem is what is charged."""

from __future__ import annotations

from llmgw.core.config.models import Source
from llmgw.core.fleet.views import GIB, held_weights_key, held_weights_keys, weights_key
from llmgw.core.placement import CacheDisk, cache_disk, explain, place

from .builders import cpu_node, cpu_profile, entry

SOURCE_A = Source(url="http://mirror/a.gguf", sha256="a" * 64)
SOURCE_B = Source(url="http://mirror/b.gguf")
KEY_A = weights_key(SOURCE_A)
KEY_B = weights_key(SOURCE_B)


def model(source: Source, disk_gb: float = 40, **kw: object):
    return entry(cpu_profile(disk_gb=disk_gb), source=source.model_dump(exclude_none=True), **kw)


def words(name: str, models, nodes) -> dict[str, str]:
    return {v.node: v.words() for v in explain(name, models, nodes, []).profiles[0].verdicts}


def test_a_node_holding_the_weights_wins_over_an_equal_one() -> None:
    assert KEY_A is not None
    models = {"a": model(SOURCE_A)}
    # Same cores, memory and disk; the holder sorts last by name, so only the weights can make it win.
    nodes = [cpu_node("a-empty", weights=frozenset()), cpu_node("z-holder", weights=frozenset({KEY_A}))]
    (placed,) = place(models, nodes, []).placements
    assert placed.nodes == ("z-holder",)
    assert "weights already there" in placed.why


def test_the_holders_disk_is_not_charged_again() -> None:
    assert KEY_A is not None
    models = {"a": model(SOURCE_A), "b": model(SOURCE_B)}
    holder = cpu_node("n", cores=16, disk_free_bytes=50 * GIB, weights=frozenset({KEY_A}))
    placed = place(models, [holder], [])
    assert sorted(p.model for p in placed.placements) == ["a", "b"]  # a costs nothing, b takes 40 of 50
    fetcher = cpu_node("n", cores=16, disk_free_bytes=50 * GIB, weights=frozenset())
    placed = place(models, [fetcher], [])
    assert [p.model for p in placed.placements] == ["a"]  # without the weights: 40 + 40 > 50
    assert [u.model for u in placed.unplaced] == ["b"]


def test_a_shared_filer_is_counted_once_across_its_nodes() -> None:
    models = {"a": model(SOURCE_A), "b": model(SOURCE_B)}
    filer = "nfs4:filer:/models"
    nodes = [
        cpu_node("n1", disk_free_bytes=50 * GIB, weights=frozenset(), shared_disk=filer),
        cpu_node("n2", disk_free_bytes=50 * GIB, weights=frozenset(), shared_disk=filer),
    ]
    placed = place(models, nodes, [])
    # Each node sees the filer's 50 GB; together they still have 50, not 100: one model fits, not two.
    assert len(placed.placements) == 1 and len(placed.unplaced) == 1
    local = [
        cpu_node("n1", disk_free_bytes=50 * GIB, weights=frozenset()),
        cpu_node("n2", disk_free_bytes=50 * GIB, weights=frozenset()),
    ]
    assert len(place(models, local, []).placements) == 2  # two local disks are two pools


def test_weights_on_a_filer_are_on_every_node_mounting_it() -> None:
    assert KEY_A is not None
    models = {"a": model(SOURCE_A)}
    filer = "nfs4:filer:/models"
    nodes = [
        cpu_node("fetched-it", disk_free_bytes=1 * GIB, weights=frozenset({KEY_A}), shared_disk=filer),
        cpu_node("mounts-it", disk_free_bytes=1 * GIB, weights=frozenset(), shared_disk=filer),
        cpu_node("elsewhere", disk_free_bytes=1 * GIB, weights=frozenset()),
    ]
    assert words("a", models, nodes) == {
        "elsewhere": "has 1 GB of disk free, needs 40",
        "fetched-it": "fits (weights already here, disk not checked)",
        "mounts-it": "fits (weights already here, disk not checked)",
    }


def test_what_an_agent_reports_holding_is_named_like_the_models_source() -> None:
    # The agent's index names an entry by url (or path) and sha256; the controller by the Model's source.
    assert held_weights_key(SOURCE_A.url, None, SOURCE_A.sha256) == KEY_A
    assert held_weights_key(SOURCE_B.url, None, None) == KEY_B
    on_node = Source(path="/srv/models/c.gguf")
    assert held_weights_key(None, on_node.path, None) == weights_key(on_node)


def test_the_cache_filesystem_is_charged_and_a_filer_never_stands_for_a_local_disk() -> None:
    root = CacheDisk(free_bytes=20 * GIB, shared=False, holds_cache=False)
    cache = CacheDisk(free_bytes=5 * GIB, shared=False, holds_cache=True)
    assert cache_disk([root, cache]) == (5 * GIB, None)  # the cache's disk, not the largest one
    filer = CacheDisk(1000 * GIB, True, True, fstype="nfs4", mount_source="filer:/models")
    assert cache_disk([root, filer]) == (1000 * GIB, "nfs4:filer:/models")
    # An agent before the cache mark: its largest local filesystem, never the filer's free terabyte.
    old_local = CacheDisk(20 * GIB, False, None)
    old_filer = CacheDisk(1000 * GIB, True, None, fstype="nfs4")
    assert cache_disk([old_local, old_filer]) == (20 * GIB, None)
    assert cache_disk([old_filer]) == (None, None)  # only a filer: unknown, not its size
    assert cache_disk(None) == (None, None) and cache_disk([]) == (None, None)


DIGEST = "d" * 64
REPO_SOURCE = Source(repo="org/tiny", revision="v1")


def test_a_published_directory_is_held_by_its_manifest_digest_and_by_its_name() -> None:
    # The agent reports a directory by its name and manifest digest; it answers to both keys, so a Model with
    # its manifest in the repo (by digest) and one without (by name: whatever the mirror publishes) both match.
    held = frozenset(held_weights_keys(None, None, None, "org/tiny@v1", DIGEST))
    assert weights_key(REPO_SOURCE, DIGEST) in held
    assert weights_key(REPO_SOURCE) in held
    assert weights_key(REPO_SOURCE, "e" * 64) not in held  # the same name, other bytes
    assert weights_key(Source(repo="org/other", revision="v1")) not in held
    # Two repo sources never share a key (they once both fell back to the key of `path: None`).
    assert weights_key(Source(repo="org/a")) != weights_key(Source(repo="org/b"))
    prefix = Source(url="http://files.internal/tiny/")
    assert weights_key(prefix) in held_weights_keys(None, None, None, "http://files.internal/tiny/", DIGEST)


def test_a_node_holding_the_directory_wins_and_its_disk_is_not_charged_again() -> None:
    directory = entry(cpu_profile(disk_gb=40), source=REPO_SOURCE.model_dump(exclude_none=True))
    models = {"tiny": directory._replace(manifest_digest=DIGEST), "b": model(SOURCE_B)}
    held = frozenset(held_weights_keys(None, None, None, "org/tiny@v1", DIGEST))
    nodes = [cpu_node("a-empty", weights=frozenset()), cpu_node("z-holder", weights=held)]
    placed = {p.model: p for p in place({"tiny": models["tiny"]}, nodes, []).placements}
    assert placed["tiny"].nodes == ("z-holder",) and "weights already there" in placed["tiny"].why
    holder = cpu_node("n", cores=16, disk_free_bytes=50 * GIB, weights=held)
    assert sorted(p.model for p in place(models, [holder], []).placements) == ["b", "tiny"]
    stale = models["tiny"]._replace(manifest_digest="e" * 64)  # the repo's manifest moved on: not held
    placed_stale = place({"tiny": stale, "b": models["b"]}, [holder], [])
    assert (
        len(placed_stale.placements) == 1 and len(placed_stale.unplaced) == 1
    )  # 40 + 40 > 50: fetched again
