"""Weights on nodes with a real controller, real agents and a real file server: the agent's cache index
reaches the controller, placement puts the model back on the node that holds its weights, and `llmgw weights
list` / `collect` remove only what llmgw fetched and no declared model references."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from controller.helpers import Admin, Agents, Repo, cluster_yaml, settings_for, start
from support import free_port, wait_for
from typer.testing import CliRunner

from llmgw.cli.main import app

pytestmark = pytest.mark.integration

BLOB = b"GGUF" + bytes(range(256)) * 64
SHA = hashlib.sha256(BLOB).hexdigest()


def weights_model(url: str) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: w}}
spec:
  context_length: 4096
  source: {{url: "{url}", sha256: {SHA}, size_bytes: {len(BLOB)}}}
  scaling: {{min: 1, max: 1}}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1, disk_gb: 0.001, args: {{decode_ms_per_token: 1}}}}
"""


@pytest.fixture
async def blob_url() -> AsyncIterator[str]:
    async def blob(request: web.Request) -> web.Response:
        return web.Response(body=BLOB)

    server = web.Application()
    server.router.add_get("/models/w.gguf", blob)
    runner = web.AppRunner(server)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/models/w.gguf"
    await runner.cleanup()


def on_disk(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


async def _files(admin: Admin, node: str) -> list[dict[str, Any]] | None:
    nodes = (await admin.get("/api/v1/weights"))["nodes"]
    found = next((n for n in nodes if n["node"] == node), None)
    return None if found is None else found["files"]


async def _node_of(admin: Admin) -> str | None:
    ready = [r for r in await admin.replicas("w") if r["state"] == "ready"]
    return ready[0]["node"] if len(ready) == 1 else None


async def _cli(url: str, token: Path, *args: str) -> str:
    result = await asyncio.to_thread(
        CliRunner().invoke, app, [*args, "--controller", url, "--token-file", str(token)]
    )
    assert result.exit_code == 0, result.output
    return result.output


async def test_weights_held_by_a_node_bring_the_model_back_there_and_collect_only_the_unreferenced(
    tmp_path: Path, blob_url: str
) -> None:
    repo = Repo(tmp_path / "origin", use_git=True)
    port = free_port()
    settings = settings_for(tmp_path, repo.path, listen=f"127.0.0.1:{port}")
    repo.write({"cluster.yaml": cluster_yaml(unreachable="10s", lost="60s")}, "cluster")
    running, admin = await start(settings)
    agents = Agents(tmp_path, tmp_path / "token")
    try:
        # Only n2 at first, so the weights land on the node that loses every tie by name.
        agents.start("n2", f"127.0.0.1:{port}")
        await wait_for(lambda: admin.node_state("n2"), 30, "n2 registered")
        repo.write({"models/w.yaml": weights_model(blob_url)}, "add w")
        assert await wait_for(lambda: _node_of(admin), 60, "w ready") == "n2"

        async def held() -> list[dict[str, Any]] | None:
            files = await _files(admin, "n2")
            return files if files and files[0]["used_by"] else None

        (entry,) = await wait_for(held, 30, "n2 reporting the fetched weights")
        assert entry["url"] == blob_url and entry["sha256"] == SHA and entry["fetched"] is True
        assert entry["size_bytes"] == len(BLOB) and entry["declared_by"] == ["w"]
        local = entry["local_path"]
        assert on_disk(local) == BLOB

        agents.start("n1", f"127.0.0.1:{port}")
        await wait_for(lambda: admin.node_state("n1"), 30, "n1 registered")
        repo.write({"models/w.yaml": None}, "remove w")
        await wait_for(lambda: _no_replicas(admin), 60, "w's replica stopped")
        assert on_disk(local) == BLOB  # stopping a replica never deletes its weights

        # Equal nodes; n1 wins by name, unless the weights count: they do.
        repo.write({"models/w.yaml": weights_model(blob_url)}, "add w again")
        assert await wait_for(lambda: _node_of(admin), 60, "w ready again") == "n2"
        explained = await admin.get("/api/v1/explain/w")
        words = {v["node"]: v["words"] for v in explained["profiles"][0]["nodes"]}
        assert words["n2"] == "fits (weights already here, disk not checked)", words

        # Declared: nothing to collect, even asked for real.
        out = json.loads(await _cli(admin.url, settings.admin_token_file, "weights", "collect", "--json"))
        assert all(not n.get("removed") for n in out["nodes"]), out
        listed = await _cli(admin.url, settings.admin_token_file, "weights", "list")
        assert "declared by w" in listed

        repo.write({"models/w.yaml": None}, "remove w for good")
        await wait_for(lambda: _no_replicas(admin), 60, "w's replica stopped")
        dry = json.loads(
            await _cli(admin.url, settings.admin_token_file, "weights", "collect", "--dry-run", "--json")
        )
        removed = {n["node"]: n.get("removed") for n in dry["nodes"]}
        assert [r["url"] for r in removed["n2"]] == [blob_url] and not removed["n1"]
        assert on_disk(local) == BLOB  # a dry run deletes nothing
        said = await _cli(admin.url, settings.admin_token_file, "weights", "collect")
        assert "removed" in said and blob_url in said
        assert on_disk(local) is None

        async def gone() -> bool:
            return await _files(admin, "n2") == []

        await wait_for(gone, 30, "n2 reporting no weights")
    finally:
        await running.stop()
        agents.cleanup()


async def _no_replicas(admin: Admin) -> bool:
    return not await admin.replicas("w")
