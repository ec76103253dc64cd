"""End to end: a real controller serving the weights mirror from a directory, a real agent process fetching a
directory source (`repo` + `revision`, its manifest in the cluster repo) through it with its own token, and the
sim engine's replica becoming ready on the published directory. The Cluster's origin is `none`: the mirror is
the only place the files can come from."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent.file_server import model_files
from llmgw_agent.dirfetch import directory_root
from llmgw_agent.protocol import WeightFile
from support import free_port, wait_for

from llmgw.adapters.mirror import MirrorStore, hash_directory, manifest_text

from .helpers import Admin, Agents, Repo, cluster_yaml, settings_for, start

pytestmark = pytest.mark.integration

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: tiny}
spec:
  context_length: 4096
  source: {repo: org/tiny, revision: v1, manifest: manifests/tiny.json}
  scaling: {min: 1, max: 1}
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, args: {decode_ms_per_token: 1}}
"""


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    source = tmp_path / "hf" / "tiny"
    files = {**model_files(), "model-00002-of-00002.safetensors": bytes(range(256)) * 8192}  # 2 MiB shard
    for name, body in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(body)
    mirror = tmp_path / "mirror"
    MirrorStore(mirror).add_directory(source, "org/tiny", "v1")
    mirror_port, port = free_port(), free_port()
    repo = Repo(tmp_path / "repo", use_git=True)
    cluster = cluster_yaml(unreachable="10s", lost="60s") + (
        f"  mirror: {{url: 'http://127.0.0.1:{mirror_port}', origin: none}}\n"
    )
    repo.write(
        {"cluster.yaml": cluster, "manifests/tiny.json": manifest_text(hash_directory(source))}, "cluster"
    )
    settings = settings_for(
        tmp_path,
        repo.path,
        listen=f"127.0.0.1:{port}",
        mirror_dir=mirror,
        mirror_listen=f"127.0.0.1:{mirror_port}",
    )
    running, admin = await start(settings)
    agents = Agents(tmp_path, tmp_path / "token")
    try:
        yield {
            "admin": admin,
            "agents": agents,
            "port": port,
            "repo": repo,
            "files": files,
            "mirror": f"http://127.0.0.1:{mirror_port}",
            "tmp": tmp_path,
        }
    finally:
        await running.stop()
        agents.cleanup()


async def test_agent_fetches_a_directory_through_the_controllers_mirror_and_the_replica_is_ready(
    setup: dict[str, Any],
) -> None:
    admin: Admin = setup["admin"]
    setup["agents"].start("n1", f"127.0.0.1:{setup['port']}")
    await wait_for(lambda: _node_ready(admin, "n1"), 30, "n1 Ready")
    setup["repo"].write({"models/tiny.yaml": MODEL}, "add tiny")

    async def ready() -> dict[str, Any] | None:
        items = await admin.replicas("tiny")
        if any(r["state"] == "failed" for r in items):
            raise AssertionError(f"replica failed: {items}")
        return next((r for r in items if r["state"] == "ready"), None)

    replica = await wait_for(ready, 60, "tiny ready")
    assert replica["fetching"] == []  # a finished fetch is not shown
    cache = setup["tmp"] / "agents" / "n1" / "state" / "weights"
    listed = [
        WeightFile(name=n, size=len(b), sha256=hashlib.sha256(b).hexdigest())
        for n, b in setup["files"].items()
    ]
    published = directory_root(cache, "org/tiny@v1", listed) / "model"
    for name, body in setup["files"].items():
        assert hashlib.sha256((published / name).read_bytes()).digest() == hashlib.sha256(body).digest()
    assert not (published.parent / "staging").exists()
    logs = "".join(p.read_text() for p in (setup["tmp"] / "agents" / "n1").glob("agent-*.log"))
    assert "published org/tiny@v1: 4 files" in logs and "test-token" not in logs

    # The mirror is read-only and needs a token the hub would accept.
    url = f"{setup['mirror']}/org/tiny/resolve/v1/config.json"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as r:
            assert r.status == 401
        async with http.get(url, headers={"Authorization": "Bearer test-token"}) as r:
            assert r.status == 200 and await r.read() == setup["files"]["config.json"]
        async with http.put(url, headers={"Authorization": "Bearer test-token"}, data=b"x") as r:
            assert r.status == 405


async def _node_ready(admin: Admin, node: str) -> bool:
    return await admin.node_state(node) == "Ready"
