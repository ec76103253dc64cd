"""What the controller sends a node for a directory source, and what it shows of the fetch. The reconcile loop
against the fake AgentClient (tests/controller/fake_agents.py): the repo, the controller and its store are real.

- the repo's manifest rides in the spec; the mirror base comes first, the origin after, with the token read from
  its secret reference; an air-gapped node gets the mirror only;
- the token is in no event, status, replica view or repr;
- progress (bytes done of the total) appears under the replica and its model while it fetches, and not after.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import wait_for

from llmgw.cli.fleet.controller_cmds import fetch_words
from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired
from llmgw.controller.status import fleet as views

from .fake_agents import FakeAgents, reconciling
from .helpers import Repo, cluster_yaml

TOKEN = "hf_NotARealTokenButSecret42"
SHA = "b" * 64
MANIFEST = {
    "files": [
        {"name": "config.json", "size": 10, "sha256": SHA},
        {"name": "w/a.safetensors", "size": 90, "sha256": SHA},
    ]
}
MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: qwen}
spec:
  context_length: 4096
  source: {repo: Qwen/Qwen2.5-0.5B, revision: abc, manifest: manifests/qwen.json, token: {file: hf-token}}
  scaling: {min: 1, max: 1}
  profiles: [{name: sim, engine: sim, cpu_cores: 1}]
"""
NODE = """\
apiVersion: llmgw/v1
kind: Node
metadata: {name: NAME}
spec: {address: 127.0.0.9, airgapped: AIR}
"""
MIRROR = "  mirror: {url: 'http://mirror.internal:7073', origin: 'https://huggingface.co'}\n"


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[Controller, FakeAgents, Reconciler, Repo]]:
    repo = Repo(tmp_path / "repo", use_git=False)
    bound = ["hf-token: {purposes: [source-token], hosts: [huggingface.co]}"]
    async with reconciling(tmp_path, repo.path, {"hf-token": TOKEN}, bound) as (c, agents, reconciler):
        yield c, agents, reconciler, repo


async def settle(reconciler: Reconciler) -> None:
    await reconciler.pass_once()
    await wait_for(lambda: reconciler.in_flight == 0, 10, "the pass's commands to finish")


def apply(c: Controller, repo: Repo, node: str, airgapped: bool) -> None:
    repo.write(
        {
            "cluster.yaml": cluster_yaml() + MIRROR,
            "manifests/qwen.json": json.dumps(MANIFEST),
            "models/qwen.yaml": MODEL,
            "nodes.yaml": NODE.replace("NAME", node).replace("AIR", str(airgapped).lower()),
        }
    )
    c.desired = build_desired(repo.path, "rev-1", "test")


@pytest.mark.parametrize("airgapped", [False, True])
async def test_the_spec_carries_the_manifest_the_mirror_first_and_the_token_for_the_origin_only(
    setup: tuple[Controller, FakeAgents, Reconciler, Repo], airgapped: bool
) -> None:
    c, agents, reconciler, repo = setup
    apply(c, repo, "n1", airgapped)
    agents.register("n1")
    await settle(reconciler)
    [sent] = agents.started()
    assert sent.spec is not None and sent.spec.source is not None
    source = sent.spec.source
    assert source.directory == "Qwen/Qwen2.5-0.5B@abc"
    assert [(f.name, f.size) for f in source.files or []] == [("config.json", 10), ("w/a.safetensors", 90)]
    bases = [(b.kind, b.url, b.token) for b in source.bases]
    mirror = ("mirror", "http://mirror.internal:7073/Qwen/Qwen2.5-0.5B/resolve/abc/", None)
    origin = ("origin", "https://huggingface.co/Qwen/Qwen2.5-0.5B/resolve/abc/", TOKEN)
    assert bases == ([mirror] if airgapped else [mirror, origin])
    assert TOKEN not in repr(sent.spec)


async def test_progress_shows_under_the_replica_while_fetching_and_no_token_anywhere(
    setup: tuple[Controller, FakeAgents, Reconciler, Repo],
) -> None:
    c, agents, reconciler, repo = setup
    apply(c, repo, "n1", False)
    agents.register("n1")
    await settle(reconciler)
    [sent] = agents.started()
    link = agents.nodes["n1"]
    shard_id = f"{sent.replica_id}-0"
    link.shards[shard_id] = link.shards[shard_id].model_copy(
        update={"state": "fetching", "fetch_bytes_done": 40, "fetch_bytes_total": 100}
    )
    rec = c.replicas[sent.replica_id]
    want = [{"replica": rec.id, "node": "n1", "bytes_done": 40, "bytes_total": 100}]
    assert views.replica_json(c, rec)["fetching"] == want
    assert views.model_health(c, "qwen")["fetching"] == want
    assert fetch_words(want[0]) == "fetching 40 B of 100 B on n1"
    assert fetch_words({"bytes_done": 2_500_000, "bytes_total": None}) == "fetching 2.5 MB so far"

    agents.report("n1", rec.id, "ready")
    assert views.replica_json(c, rec)["fetching"] == []
    events = await c.store.recent_events(limit=100)
    shown = json.dumps(
        [views.replica_json(c, rec), views.status_json(c), [str(e) for e in events]], default=str
    )
    assert TOKEN not in shown


async def test_an_unreadable_token_is_a_wait_reason_naming_the_reference(
    setup: tuple[Controller, FakeAgents, Reconciler, Repo], tmp_path: Path
) -> None:
    c, agents, reconciler, repo = setup
    (tmp_path / "secrets" / "hf-token").unlink()
    apply(c, repo, "n1", False)
    agents.register("n1")
    await settle(reconciler)
    assert agents.started() == []
    wait = c.worker_state.model("qwen").wait or ""
    assert wait.startswith("cannot start:") and "hf-token" in wait
