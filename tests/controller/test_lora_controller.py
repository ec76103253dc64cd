"""The controller sends each replica of a base model its Adapter documents (ShardSpec.adapters, in the order
the engine loads them, each source as the node fetches it) and publishes to routers which adapters exist and
which replicas carry them. The reconcile loop against the fake AgentClient; repo, controller and store real."""

from __future__ import annotations

from llmgw_agent.engines import LaunchContext, launch_plan
from llmgw_agent.protocol import EngineInstall
from support import wait_for

from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired
from llmgw.controller.wire.publisher import snapshot

from .fake_agents import FakeAgents
from .helpers import Repo, cluster_yaml
from .test_manifest_fingerprint import settle, setup  # noqa: F401  (the fixture)

REPO = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: gemma}
spec:
  context_length: 2048
  source: {path: /models/gemma.gguf}
  scaling: {min: 1, max: 1}
  profiles: [{name: cpu, engine: llamacpp, slots: 2}]
---
apiVersion: llmgw/v1
kind: Adapter
metadata: {name: gemma-support}
spec: {base: gemma, source: {path: /adapters/support.gguf}, scale: 0.5}
---
apiVersion: llmgw/v1
kind: Adapter
metadata: {name: gemma-legal}
spec: {base: gemma, source: {path: /adapters/legal.gguf}}
"""


async def test_a_replica_is_started_with_its_bases_adapters_and_routers_are_told(
    setup: tuple[Controller, FakeAgents, Reconciler, Repo],  # noqa: F811
) -> None:
    c, agents, reconciler, repo = setup
    repo.write({"cluster.yaml": cluster_yaml(), "models/gemma.yaml": REPO})
    c.desired = build_desired(repo.path, "rev-1", "test")
    agents.register("n1", engines={"llamacpp": EngineInstall(version="11434", origin="declared")})
    await settle(reconciler)
    [sent] = agents.started()
    assert sent.spec is not None
    assert [(a.name, a.source.path) for a in sent.spec.adapters] == [
        ("gemma-legal", "/adapters/legal.gguf"),
        ("gemma-support", "/adapters/support.gguf"),
    ]
    paths = tuple((a.name, str(a.source.path)) for a in sent.spec.adapters)
    ctx = LaunchContext("127.0.0.1", 20001, "/models/gemma.gguf", "/w", None, adapters=paths)
    argv = launch_plan(sent.spec, ctx).argv
    assert argv[-5:] == [
        "--lora",
        "/adapters/legal.gguf",
        "--lora",
        "/adapters/support.gguf",
        "--lora-init-without-apply",
    ]
    link = agents.nodes["n1"]
    shard_id = f"{sent.spec.replica_id}-0"
    link.shards[shard_id] = link.shards[shard_id].model_copy(update={"base_url": "http://127.0.0.1:9001"})
    agents.report("n1", sent.spec.replica_id, "ready")
    published = await wait_for(
        lambda: (s := snapshot(c)) is not None and s.endpoints and s, 10, "a ready endpoint"
    )
    assert set(published.adapters) == {"gemma-legal", "gemma-support"}
    assert published.adapters["gemma-support"].scale == 0.5
    assert published.adapters["gemma-support"].path == "/adapters/support.gguf"
    [ep] = published.endpoints
    assert ep.adapters == ["gemma-legal", "gemma-support"]  # llama.cpp's ids 0 and 1
