"""The controller sends a profile's tp and pp with each shard (ShardSpec.tp/pp), so the agent can give them to
the engine (tests/agent/test_parallelism.py): `tp: 2, pp: 2, gpus: 4` reaches the node as 2 and 2 on four
GPUs. The reconcile loop against the fake AgentClient; repo, controller and store are real."""

from __future__ import annotations

from llmgw_agent.engines import LaunchContext, launch_plan
from llmgw_agent.protocol import EngineInstall, Gpu

from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired

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
    - {name: a100x4, engine: vllm, gpu_class: a100-80gb, gpus: 4, tp: 2, pp: 2}
"""


async def test_tp_and_pp_ride_with_the_shard_and_become_the_engines_flags(
    setup: tuple[Controller, FakeAgents, Reconciler, Repo],  # noqa: F811
) -> None:
    c, agents, reconciler, repo = setup
    repo.write({"cluster.yaml": cluster_yaml(), "models/big.yaml": MODEL})
    c.desired = build_desired(repo.path, "rev-1", "test")
    gpus = [Gpu(index=i, gpu_class="a100-80gb", memory_bytes=80 << 30) for i in range(4)]
    agents.register("g1", gpus=gpus, engines={"vllm": EngineInstall(version="0.11.0", origin="declared")})
    await settle(reconciler)
    [sent] = agents.started()
    assert sent.spec is not None
    assert (sent.spec.tp, sent.spec.pp, sent.spec.gpus) == (2, 2, [0, 1, 2, 3])
    argv = launch_plan(sent.spec, LaunchContext("127.0.0.1", 20001, "/models/big", "/w", None)).argv
    assert argv[argv.index("-tp") + 1] == "2" and argv[argv.index("-pp") + 1] == "2"
