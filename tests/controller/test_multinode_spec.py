"""The controller tells each shard of a multi-node replica where they meet: rank 0's fabric address and the
replica's port, and each node's own fabric address (tests/agent/test_multinode.py runs what the agents do with
it). The reconcile loop against the fake AgentClient; repo, controller and store are real."""

from __future__ import annotations

from llmgw_agent.protocol import EngineInstall, Gpu

from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired
from llmgw.core.fleet.distributed import rendezvous_port

from .fake_agents import FakeAgents
from .helpers import Repo, cluster_yaml
from .test_manifest_fingerprint import settle, setup  # noqa: F401  (the fixture)

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: big}
spec:
  context_length: 8192
  source: {path: /models/big}
  scaling: {min: 1, max: 1}
  profiles:
    - {name: two-nodes, engine: vllm, gpu_class: a100-80gb, gpus: 2, tp: 2, pp: 2, nodes: 2}
"""
NODE = "apiVersion: llmgw/v1\nkind: Node\nmetadata: {name: %s}\nspec: {address: %s, fabric: ib0%s}\n"


async def test_each_shard_is_told_the_head_and_its_own_fabric_address(
    setup: tuple[Controller, FakeAgents, Reconciler, Repo],  # noqa: F811
) -> None:
    c, agents, reconciler, repo = setup
    repo.write(
        {
            "cluster.yaml": cluster_yaml(),
            "models/big.yaml": MODEL,
            "nodes/g1.yaml": NODE % ("g1", "10.0.0.1", ", fabric_address: 192.168.50.1"),
            "nodes/g2.yaml": NODE % ("g2", "10.0.0.2", ""),
        }
    )
    c.desired = build_desired(repo.path, "rev-1", "test")
    gpus = [Gpu(index=i, gpu_class="a100-80gb", memory_bytes=80 << 30) for i in range(2)]
    engines = {"vllm": EngineInstall(version="0.11.0", origin="declared")}
    agents.register("g1", gpus=gpus, engines=engines)
    agents.register("g2", gpus=gpus, engines=engines)
    await settle(reconciler)
    sent = {s.spec.shard_rank: (s.node, s.spec) for s in agents.started() if s.spec is not None}
    assert sorted(sent) == [0, 1], sent
    head_node = sent[0][0]
    head_address = {"g1": "192.168.50.1", "g2": "10.0.0.2"}[head_node]
    for rank, (node, spec) in sent.items():
        assert spec.shard_count == 2 and (spec.tp, spec.pp) == (2, 2)
        assert spec.rendezvous is not None
        assert (spec.rendezvous.host, spec.rendezvous.port) == (
            head_address,
            rendezvous_port(spec.replica_id),
        )
        assert spec.fabric_address == {"g1": "192.168.50.1", "g2": "10.0.0.2"}[node], (rank, node)
