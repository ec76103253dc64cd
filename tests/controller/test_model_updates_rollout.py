"""New weights upstream rolled through a real controller and two real agents (sim engines), the files fetched by
the agents from a local HTTP origin (tests/hf_origin.py; the Cluster names no mirror, so the origin is the only
place they can come from).

`llmgw model update small --write` and a commit: the controller applies it and replaces the replicas one at a
time, never both down; each node's running shard was given the new checksums and its weights cache holds files
with exactly those. `git revert` of that commit is the rollback: the old checksums are back on every node.

One replica fits a node (one core each) and the model rolls `max_surge: 0, max_unavailable: 1`: the replacement
takes the place its old replica left, so every node must fetch the new files (make-before-break with a surge
would let both replacements land on one node, and the other node's cache would prove nothing)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from faults.cluster import Cluster
from hf_origin import Origin, files_of, running_origin
from llmgw_agent.dirfetch import directory_root
from llmgw_agent.protocol import WeightFile
from support import wait_for
from typer.testing import CliRunner

from controller.helpers import cluster_yaml
from llmgw.cli.main import app
from llmgw.core.weights.manifest import manifest_json

pytestmark = pytest.mark.integration

C1, C2 = "1" * 7 + "a" * 33, "2" * 7 + "b" * 33
OLD = {"config.json": b"{}", "model.gguf": b"old weights" * 100}
NEW = {"config.json": b"{}", "model.gguf": b"new weights" * 120}
NODES = ("n1", "n2")
MODEL = f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: small}}
spec:
  context_length: 4096
  source: {{repo: org/small, revision: '{C1[:7]}', manifest: manifests/small.json}}
  scaling: {{min: 2, max: 2}}
  rollout: {{on_change: restart, max_surge: 0, max_unavailable: 1}}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1, args: {{decode_ms_per_token: 1}}}}
"""


@pytest.fixture
def origin() -> Iterator[Origin]:
    with running_origin() as o:
        yield o


@pytest.fixture
async def cluster(tmp_path: Path, origin: Origin) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        manifest = json.dumps(manifest_json(files_of(OLD)), indent=1) + "\n"
        cluster_doc = cluster_yaml(unreachable="2s", lost="30s") + f"  mirror: {{origin: '{origin.url}'}}\n"
        c.repo.write({"cluster.yaml": cluster_doc, "manifests/small.json": manifest}, "cluster")
        admin = await c.start_controller()
        for node in NODES:
            c.agents.start(node, c.address, cpu_cores=1)  # one replica a node

        async def all_ready() -> bool:
            return all([await admin.node_state(n) == "Ready" for n in NODES])

        await wait_for(all_ready, 30, f"nodes {NODES} Ready")
        yield c
    finally:
        await c.close()


def ready_times(cluster: Cluster) -> dict[str, float]:
    """Replica id -> when the controller saw it ready, for the model's live replicas."""
    assert cluster.running is not None
    recs = cluster.running.controller.fleet.replicas.values()
    return {r.id: r.ready_since for r in recs if r.model == "small" and r.ready_since is not None}


async def settled(cluster: Cluster, not_in: set[str]) -> dict[str, float]:
    """Two ready replicas of small, none of `not_in`, one on each node: their ready times."""

    admin = cluster.admin
    assert admin is not None

    async def done() -> dict[str, float] | None:
        items = await admin.replicas("small")
        if any(r["state"] == "failed" for r in items):
            raise AssertionError(f"a replica failed: {items}")
        ids = {r["id"] for r in items if r["state"] == "ready" and r["id"] not in not_in}
        nodes = sorted(r["node"] for r in items if r["id"] in ids)
        times = ready_times(cluster)
        return times if len(items) == 2 and nodes == list(NODES) and ids <= set(times) else None

    found: dict[str, float] = await wait_for(done, 90, "two fresh ready replicas of small, one a node")
    return found


def cached_root(tmp: Path, node: str, replicas: set[str]) -> tuple[Path, list[WeightFile]]:
    """The weights cache's dir-<hash> root the node's shard of one of `replicas` runs on, and the files its
    record on the agent says it was given."""
    state = tmp / "agents" / node / "state"
    records = [json.loads(p.read_text()) for p in (state / "shards").glob("*.json")]
    [spec] = [r["spec"] for r in records if r["spec"]["replica_id"] in replicas]
    source = spec["source"]
    files = [WeightFile.model_validate(f) for f in source["files"]]
    return directory_root(state / "weights", source["directory"], files), files


def served(tmp: Path, node: str, replicas: set[str]) -> dict[str, str]:
    """File name -> sha256 the node's shard of one of `replicas` was given, each checked against the file the
    node's weights cache holds for it."""
    root, files = cached_root(tmp, node, replicas)
    for f in files:
        assert hashlib.sha256((root / "model" / f.name).read_bytes()).hexdigest() == f.sha256, (node, f.name)
    return {f.name: f.sha256 for f in files}


def recorded(tmp: Path, node: str, replicas: set[str]) -> tuple[str, str, dict[str, tuple[str, str]]]:
    """The cache's origin record beside those files (llmgw-origin.json): repository, revision, and per file
    where it was fetched from and its sha256, each fetch time set."""
    root, _ = cached_root(tmp, node, replicas)
    record = json.loads((root / "llmgw-origin.json").read_text())
    assert all(isinstance(f["fetched_at"], float) for f in record["files"]), record
    files = {f["name"]: (f["from"], f["sha256"]) for f in record["files"]}
    return record["repository"], record["revision"], files


def from_origin(origin: Origin, revision: str, files: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    base = f"{origin.url}/org/small/resolve/{revision}/"
    return {name: (base + name, sha) for name, sha in checksums(files).items()}


def checksums(files: dict[str, bytes]) -> dict[str, str]:
    return {f.name: f.sha256 for f in files_of(files)}


async def rolled_one_at_a_time(
    cluster: Cluster, old: dict[str, float], new: dict[str, float], since: float
) -> None:
    """From the controller's events: each old replica stopped while another replica was ready, i.e. the model
    was never without a ready replica, and every new replica was started after an old one had stopped."""
    events = [e for e in await cluster.events(since) if e["object"] in old.keys() | new.keys()]
    stops = {e["object"]: e["time"] for e in events if e["kind"] == "replica_stop"}
    starts = sorted(e["time"] for e in events if e["kind"] == "replica_start")
    assert set(stops) == set(old) and len(starts) == len(new), events
    up = {r: (t, stops.get(r, float("inf"))) for r, t in (old | new).items()}
    for stopping, at in stops.items():
        serving = [r for r, (ready, down) in up.items() if r != stopping and ready <= at < down]
        assert serving, f"{stopping} stopped at {at} with no other replica ready: {up}"
    first_stop = min(stops.values())
    assert all(t >= first_stop for t in starts), f"a replacement started before any old one stopped: {events}"


async def listed_origins(cluster: Cluster, tmp: Path, origin: Origin) -> None:
    """`llmgw weights list` names each node's cached versions with where their files came from."""
    admin = cluster.admin
    assert admin is not None
    nodes = (await admin.get("/api/v1/weights"))["nodes"]
    versions = {(n["node"], f["origin"]["revision"]) for n in nodes for f in n["files"] if f["origin"]}
    assert versions == {(n, r) for n in NODES for r in (C1[:7], C2)}, nodes
    token = tmp / "admin-token"
    token.write_text(admin.headers["Authorization"].removeprefix("Bearer "))
    args = ["weights", "list", "--controller", admin.url, "--token-file", str(token)]
    shown = await asyncio.to_thread(CliRunner().invoke, app, args, env={"COLUMNS": "400"})  # one line a row
    assert shown.exit_code == 0, shown.output
    assert f"org/small@{C2}: 2 file(s) from {origin.url}/org/small/resolve/{C2}/" in shown.output


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


async def test_an_update_rolls_one_replica_at_a_time_and_its_revert_restores_the_old_checksums(
    cluster: Cluster, origin: Origin, tmp_path: Path
) -> None:
    origin.push(C1, OLD)
    cluster.repo.write({"models/small.yaml": MODEL}, "small")
    first = await settled(cluster, set())
    assert {n: served(tmp_path, n, set(first)) for n in NODES} == dict.fromkeys(NODES, checksums(OLD))
    # Each node's cache records where the files of the version it runs came from.
    old_origin = ("org/small", C1[:7], from_origin(origin, C1[:7], OLD))
    assert {n: recorded(tmp_path, n, set(first)) for n in NODES} == dict.fromkeys(NODES, old_origin)

    origin.push(C2, NEW)
    repo = str(cluster.repo.path)
    listed = json.loads(await asyncio.to_thread(cli, "model", "updates", repo, "--json"))
    assert [(u["model"], u["state"], u["changed"]) for u in listed] == [("small", "changed", ["model.gguf"])]
    await asyncio.to_thread(cli, "model", "update", "small", repo, "--write")
    assert cluster.running is not None
    wall = cluster.running.controller.wall
    since = wall()
    cluster.repo.write({}, "small: new weights upstream")
    second = await settled(cluster, set(first))
    await rolled_one_at_a_time(cluster, first, second, since)
    assert {n: served(tmp_path, n, set(second)) for n in NODES} == dict.fromkeys(NODES, checksums(NEW))
    assert origin.gets[f"{C2}/model.gguf"] == len(NODES)  # each node fetched the new file from the origin
    new_origin = ("org/small", C2, from_origin(origin, C2, NEW))
    assert {n: recorded(tmp_path, n, set(second)) for n in NODES} == dict.fromkeys(NODES, new_origin)
    await listed_origins(cluster, tmp_path, origin)  # both versions, as the operator sees them

    assert cluster.repo.git is not None
    since = wall()
    fetched_old = dict(origin.gets)
    cluster.repo.git.git.revert("--no-edit", "HEAD")
    cluster.repo.git.close()
    third = await settled(cluster, set(first) | set(second))
    await rolled_one_at_a_time(cluster, second, third, since)
    assert {n: served(tmp_path, n, set(third)) for n in NODES} == dict.fromkeys(NODES, checksums(OLD))
    assert origin.gets == fetched_old  # the old files were still in each node's cache: nothing fetched again
