"""`llmgw model updates` asks the origin each version recorded, and `model update --write --mirror-dir` puts the new
revision into the mirror before it moves the pins.

A real mirror (llmgw.adapters.mirror, served over HTTP) holds `org/small` added from one local HTTP origin
(tests/hf_origin.py) and `org/local` added from a local directory; the Cluster's `mirror.origin` is another origin
that holds nothing. `updates` asks the first for `org/small` (the mirror's llmgw-origin.json names it) and says so;
for `org/local` it falls back to the configured one and says why. The update fetches the new commit's files from
the recorded origin into the mirror, checked against the sha256 the origin named, and records where they came
from, so the next `updates` follows the new version's record too."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hf_origin import Origin, running_app, running_origin
from typer.testing import CliRunner

from llmgw.adapters.mirror import MirrorStore, mirror_app
from llmgw.cli.main import app

C1, C2 = "1" * 7 + "c" * 33, "2" * 7 + "d" * 33
OLD = {"config.json": b"{}", "model.gguf": b"old weights" * 100}
NEW = {"config.json": b"{}", "model.gguf": b"new weights" * 120}
MODELS = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: small}
spec:
  context_length: 4096
  source: {repo: org/small, revision: 'REV'}
  profiles: [{name: cpu, engine: sim}]
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: local}
spec:
  context_length: 4096
  source: {repo: org/local, revision: v1}
  profiles: [{name: cpu, engine: sim}]
"""


@pytest.fixture
def origins() -> Iterator[tuple[Origin, Origin]]:
    """The origin `org/small` was added from, and the Cluster's configured one (which holds nothing)."""
    with running_origin() as recorded, running_origin() as configured:
        yield recorded, configured


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"LLMGW_MIRROR_DIR": None})
    assert result.exit_code == 0, result.output
    return result.output


def updates(repo: Path) -> dict[str, dict[str, object]]:
    return {u["model"]: u for u in json.loads(cli("model", "updates", str(repo), "--json"))}


def write_repo(tmp_path: Path, mirror_url: str, configured: Origin) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "cluster.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: t}\n"
        f"spec:\n  mirror: {{url: '{mirror_url}', origin: '{configured.url}'}}\n"
    )
    (repo / "models.yaml").write_text(MODELS.replace("REV", C1[:7]))
    return repo


def fill_mirror(tmp_path: Path, recorded: Origin) -> MirrorStore:
    store = MirrorStore(tmp_path / "mirror")
    asyncio.run(store.add_url(f"{recorded.url}/org/small/resolve/{C1}/", "org/small", C1[:7]))
    local = tmp_path / "local"
    local.mkdir()
    (local / "model.gguf").write_bytes(b"local weights")
    store.add_directory(local, "org/local", "v1")
    return store


@dataclass(frozen=True)
class Served:
    recorded: Origin
    store: MirrorStore
    mirror_url: str
    repo: Path


@pytest.fixture
def served(tmp_path: Path, origins: tuple[Origin, Origin]) -> Iterator[Served]:
    """org/small@C1 in a served mirror, added from `recorded`; a cluster repo pinning it and org/local."""
    recorded, configured = origins
    recorded.push(C1, OLD)
    store = fill_mirror(tmp_path, recorded)
    with running_app(mirror_app(store.root, lambda _token: True)) as mirror_url:
        yield Served(recorded, store, mirror_url, write_repo(tmp_path, mirror_url, configured))


def test_updates_asks_each_versions_recorded_origin_and_update_fills_the_mirror_first(
    served: Served, origins: tuple[Origin, Origin]
) -> None:
    recorded, store, mirror_url, repo = served.recorded, served.store, served.mirror_url, served.repo
    configured = origins[1]
    found = updates(repo)
    assert found["small"]["state"] == "current", found
    assert found["small"]["origin"] == f"{recorded.url} (recorded by the mirror for org/small@{C1[:7]})"
    # Added from a directory: no registry recorded, so the configured origin is asked (it has nothing).
    assert found["local"]["state"] == "not checked" and "HTTP 404" in str(found["local"]["detail"])
    assert str(found["local"]["origin"]).startswith(f"{configured.url} (the Cluster's mirror.origin: ")
    assert "names 'local directory " in str(found["local"]["origin"])
    assert f"asked {recorded.url} (recorded" in cli("model", "updates", str(repo))

    recorded.push(C2, NEW)
    found = updates(repo)
    assert (found["small"]["state"], found["small"]["revision"]) == ("changed", C2)
    said = cli("model", "update", "small", str(repo))
    assert f"not put into the mirror ({mirror_url}): no --mirror-dir given" in said
    said = cli("model", "update", "small", str(repo), "--mirror-dir", str(store.root))
    assert (
        f"would add org/small@{C2} to the mirror" in said and not store.version_dir("org/small", C2).exists()
    )
    said = cli("model", "update", "small", str(repo), "--mirror-dir", str(store.root), "--write")
    assert (
        f"added org/small@{C2} to the mirror at {store.root} from {recorded.url}/org/small/resolve/{C2}/"
        in said
    )
    assert f"revision: '{C2}'" in (repo / "models.yaml").read_text()

    version = store.version_dir("org/small", C2)
    assert {n: (version / n).read_bytes() for n in NEW} == NEW
    record = json.loads((version / "llmgw-origin.json").read_text())
    assert (record["repository"], record["revision"]) == ("org/small", C2)
    base = f"{recorded.url}/org/small/resolve/{C2}/"
    assert {f["name"]: (f["from"], f["sha256"]) for f in record["files"]} == {
        n: (base + n, hashlib.sha256(b).hexdigest()) for n, b in NEW.items()
    }
    assert recorded.gets[f"{C2}/model.gguf"] == 1
    # The next check follows the new version's record: the files the mirror now serves, at their origin.
    found = updates(repo)
    assert found["small"]["state"] == "current"
    assert found["small"]["origin"] == f"{recorded.url} (recorded by the mirror for org/small@{C2})"


def test_an_update_whose_files_do_not_match_at_the_origin_adds_nothing_and_moves_no_pin(
    served: Served,
) -> None:
    store, repo = served.store, served.repo
    served.recorded.push(C2, NEW)
    served.recorded.corrupt = {"model.gguf"}  # HEAD names the new sha256; GET sends other bytes
    before = (repo / "models.yaml").read_text()
    args = ["model", "update", "small", str(repo), "--mirror-dir", str(store.root), "--write"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 1, refused.output
    assert f"org/small@{C2}: not put into the mirror, so the pins are not moved" in refused.output
    assert "model.gguf" in refused.output and "sha256" in refused.output
    assert (repo / "models.yaml").read_text() == before
    assert not store.version_dir("org/small", C2).exists()
    assert not list(store.root.glob("org/small/.adding-*"))  # nothing half-added
