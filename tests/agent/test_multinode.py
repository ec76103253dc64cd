"""A two-node vLLM replica over Ray, started through two real agents (issue 19).

Each agent is its own process with its own (fake) controller; the engines are the strict vLLM and Ray stand-ins
(tests/agent/standins/vllm, ray), which imitate what llmgw relies on: `ray start --head` / `--address`, `ray
status`, vLLM refusing a Ray cluster short of GPUs and dying when a node leaves. No real Ray or vLLM ran here."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from llmgw_agent.protocol import ShardStatus
from llmgw_agent.ray_launch import active_nodes
from support import wait_for

from llmgw.core.fleet.distributed import rendezvous_port

from .fake_controller import FakeController
from .test_daemon import AgentProcs, registered, until_state

pytestmark = pytest.mark.integration
STANDINS = Path(__file__).parent / "standins"
REPLICA = "big-0"


@pytest.fixture
async def controllers() -> AsyncIterator[tuple[FakeController, FakeController]]:
    a, b = FakeController(token="agent-token"), FakeController(token="agent-token")
    await a.start()
    await b.start()
    yield a, b
    await a.stop()
    await b.stop()


@pytest.fixture
def two_agents(tmp_path: Path) -> Iterator[tuple[AgentProcs, AgentProcs]]:
    a, b = AgentProcs(tmp_path / "a"), AgentProcs(tmp_path / "b")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    yield a, b
    a.cleanup()
    b.cleanup()


def _shard(rank: int, port: int, weights: Path) -> dict[str, Any]:
    return {
        "replica_id": REPLICA,
        "shard_rank": rank,
        "shard_count": 2,
        "model": "big",
        "engine": "vllm",
        "source": {"path": str(weights)},
        "gpus": [0],
        "tp": 2,
        "pp": 1,
        "api_key": "engine-key",
        "served_model_name": "big",
        "rendezvous": {"host": "127.0.0.1", "port": port},
        "fabric_address": "127.0.0.1",
    }


def test_ray_status_is_read_as_ray_prints_it() -> None:
    text = "Node status\n---\nActive:\n 1 node_ab12\n 1 node_cd34\nPending:\n (no pending nodes)\n"
    assert active_nodes(text) == 2
    assert active_nodes("no cluster here") is None


async def test_rank_0_waits_for_its_worker_and_a_killed_worker_fails_the_replica(
    controllers: tuple[FakeController, FakeController],
    two_agents: tuple[AgentProcs, AgentProcs],
    tmp_path: Path,
) -> None:
    ctl_a, ctl_b = controllers
    agent_a, agent_b = two_agents
    engines = {"vllm": {"path": str(STANDINS / "vllm"), "version": "0.10.1"}}
    agent_a.start([ctl_a.url], node="node-a", engines=engines)
    agent_b.start([ctl_b.url], node="node-b", engines=engines)
    await registered(ctl_a)
    await registered(ctl_b)
    weights = tmp_path / "weights"
    weights.mkdir()
    port = rendezvous_port(f"{REPLICA}-{tmp_path.name}")

    # Rank 0 first: its Ray head comes up and waits, and it is not ready without its worker.
    reply = await ctl_a.command("start_shard", spec=_shard(0, port, weights))
    assert reply.ok, reply.error

    def head_waiting() -> ShardStatus | None:
        # Heartbeats carry each shard's latest output lines.
        shards = ctl_a.heartbeats[-1].shards if ctl_a.heartbeats else []
        for s in shards:
            if s.replica_id == REPLICA and any("waiting for 2 Ray nodes" in x for x in s.last_output_lines):
                return s
        return None

    waiting = await wait_for(head_waiting, limit_s=60, what="rank 0 waiting for its Ray worker")
    assert waiting.state == "starting", waiting
    assert not any(s.state == "ready" for s in ctl_a.updates if s.replica_id == REPLICA)

    since_a = len(ctl_a.updates)
    reply = await ctl_b.command("start_shard", spec=_shard(1, port, weights))
    assert reply.ok, reply.error
    worker = await until_state(ctl_b, REPLICA, "ready", "failed")
    assert worker.state == "ready", worker.last_output_lines
    head = await until_state(ctl_a, REPLICA, "ready", "failed", since=since_a)
    assert head.state == "ready", head.last_output_lines
    assert head.pid is not None and worker.pid is not None
    agent_a.engine_pids.add(head.pid)
    agent_b.engine_pids.add(worker.pid)
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": "Bearer engine-key"}
        async with http.get(f"{head.base_url}/v1/models", headers=headers) as resp:
            assert resp.status == 200, "rank 0 serves the API once the world is whole"

    # The worker dies: its Ray node leaves, vLLM on the head loses its actor, and rank 0 fails too.
    since_a, since_b = len(ctl_a.updates), len(ctl_b.updates)
    os.killpg(worker.pid, signal.SIGKILL)
    dead_worker = await until_state(ctl_b, REPLICA, "failed", since=since_b)
    dead_head = await until_state(ctl_a, REPLICA, "failed", since=since_a)
    assert dead_worker.exit_code is not None
    assert any("RayWorkerWrapper died" in line for line in dead_head.last_output_lines), (
        dead_head.last_output_lines
    )


async def test_a_multi_node_shard_without_its_rendezvous_is_refused(
    controllers: tuple[FakeController, FakeController],
    two_agents: tuple[AgentProcs, AgentProcs],
    tmp_path: Path,
) -> None:
    ctl_a, _ = controllers
    agent_a, _ = two_agents
    agent_a.start([ctl_a.url], engines={"vllm": {"path": str(STANDINS / "vllm")}})
    await registered(ctl_a)
    spec = _shard(0, 29500, tmp_path) | {"rendezvous": None}
    reply = await ctl_a.command("start_shard", spec=spec)
    assert not reply.ok and "needs its rendezvous and fabric address" in (reply.error or ""), reply.error
    sglang = _shard(0, 29500, tmp_path) | {"engine": "sglang"}
    reply = await ctl_a.command("start_shard", spec=sglang)
    assert not reply.ok and "vllm over Ray only" in (reply.error or ""), reply.error
