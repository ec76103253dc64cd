"""Published directory sources in the nodes' weights index, end to end: a real controller serving its mirror,
real agent processes fetching `org/tiny@v1` through it. The directory is reported by its name and manifest
digest, listed by `llmgw weights list`, brings the model back to the node that holds it (placement's "weights
already here", its disk not charged again), and `llmgw weights collect` removes it only once no declared model
names it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support import wait_for
from typer.testing import CliRunner

from llmgw.adapters.mirror import hash_directory
from llmgw.cli.main import app
from llmgw.core.weights.manifest import digest

from .helpers import Admin
from .test_mirror_e2e import MODEL, setup  # noqa: F401  (the fixture: controller, mirror, agents)

pytestmark = pytest.mark.integration

# The node's disk is charged for the model's 0.001 GB unless the weights are already there.
MODEL_WITH_DISK = MODEL.replace("cpu_cores: 1,", "cpu_cores: 1, disk_gb: 0.001,")


async def _files(admin: Admin, node: str) -> list[dict[str, Any]] | None:
    nodes = (await admin.get("/api/v1/weights"))["nodes"]
    found = next((n for n in nodes if n["node"] == node), None)
    return None if found is None else found["files"]


async def _ready_on(admin: Admin) -> str | None:
    items = await admin.replicas("tiny")
    if any(r["state"] == "failed" for r in items):
        raise AssertionError(f"replica failed: {items}")
    ready = [r for r in items if r["state"] == "ready"]
    return ready[0]["node"] if len(ready) == 1 else None


async def _no_replicas(admin: Admin) -> bool:
    return not await admin.replicas("tiny")


async def _cli(admin: Admin, token: Path, *args: str) -> str:
    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        [*args, "--controller", admin.url, "--token-file", str(token)],
        env={"COLUMNS": "200"},  # the table's rows on one line each
    )
    assert result.exit_code == 0, result.output
    return result.output


async def test_a_published_directory_is_indexed_placed_on_and_collected_by_its_manifest(
    setup: dict[str, Any],  # noqa: F811
) -> None:
    admin: Admin = setup["admin"]
    agents, repo, tmp = setup["agents"], setup["repo"], setup["tmp"]
    token = tmp / "token"  # settings_for: the admin token file
    manifest = digest(hash_directory(tmp / "hf" / "tiny"))
    port = setup["port"]
    agents.start("n2", f"127.0.0.1:{port}")  # alone at first: the directory lands on the node losing ties
    await wait_for(lambda: admin.node_state("n2"), 30, "n2 registered")
    repo.write({"models/tiny.yaml": MODEL_WITH_DISK}, "add tiny")
    assert await wait_for(lambda: _ready_on(admin), 60, "tiny ready") == "n2"

    async def held() -> list[dict[str, Any]] | None:
        files = await _files(admin, "n2")
        return files if files and files[0]["used_by"] else None

    (entry,) = await wait_for(held, 30, "n2 reporting the published directory")
    assert entry["directory"] == "org/tiny@v1" and entry["manifest_sha256"] == manifest
    assert entry["key"] == f"manifest:{manifest}" and entry["declared_by"] == ["tiny"]
    assert entry["fetched"] is True and entry["url"] is None
    assert entry["size_bytes"] == sum(len(b) for b in setup["files"].values())
    published = Path(entry["local_path"])
    assert published.name == "model" and (published / "config.json").is_file()
    listed = await _cli(admin, token, "weights", "list")
    assert "org/tiny@v1 (directory, manifest " + manifest[:12] in listed and "declared by tiny" in listed

    agents.start("n1", f"127.0.0.1:{port}")
    await wait_for(lambda: admin.node_state("n1"), 30, "n1 registered")
    repo.write({"models/tiny.yaml": None}, "remove tiny")
    await wait_for(lambda: _no_replicas(admin), 60, "tiny's replica stopped")
    assert await asyncio.to_thread(published.is_dir)  # stopping a replica never deletes its weights

    # Equal nodes; n1 wins by name unless the directory counts: it does.
    repo.write({"models/tiny.yaml": MODEL_WITH_DISK}, "add tiny again")
    assert await wait_for(lambda: _ready_on(admin), 60, "tiny ready again") == "n2"
    explained = await admin.get("/api/v1/explain/tiny")
    words = {v["node"]: v["words"] for v in explained["profiles"][0]["nodes"]}
    assert words["n2"] == "fits (weights already here, disk not checked)", words

    out = json.loads(await _cli(admin, token, "weights", "collect", "--json"))
    assert all(not n.get("removed") for n in out["nodes"]), out  # declared: kept
    repo.write({"models/tiny.yaml": None}, "remove tiny for good")
    await wait_for(lambda: _no_replicas(admin), 60, "tiny's replica stopped")
    dry = json.loads(await _cli(admin, token, "weights", "collect", "--dry-run", "--json"))
    removed = {n["node"]: n.get("removed") for n in dry["nodes"]}
    assert [r["directory"] for r in removed["n2"]] == ["org/tiny@v1"] and not removed["n1"]
    assert await asyncio.to_thread(published.is_dir)  # a dry run deletes nothing
    said = await _cli(admin, token, "weights", "collect")
    assert "removed directory org/tiny@v1" in said
    assert not await asyncio.to_thread(published.parent.exists)  # the whole dir-<hash> root

    async def gone() -> bool:
        return await _files(admin, "n2") == []

    await wait_for(gone, 30, "n2 reporting no weights")
