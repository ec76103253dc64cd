"""L6: a replica id names directories and files under the agent's state dir, so the agent takes only name-like ids
(whatever the controller link says). L7: engine keys and the router's debug token are compared in constant time."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from llmgw_agent import sim
from llmgw_agent.engine_process import proc_start_time
from llmgw_agent.engines import SpecError
from llmgw_agent.protocol import ShardSpec, ShardStatus
from llmgw_agent.sim import SimEngine
from llmgw_agent.sim_model import LatencyConfig
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import free_port_range, wait_for


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
async def sup(tmp_path: Path) -> AsyncIterator[Supervisor]:
    updates: list[ShardStatus] = []
    ports = free_port_range(100)
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state", advertise_host="127.0.0.1", port_range=(ports, ports + 99)
    )
    supervisor = Supervisor(cfg, updates.append)
    yield supervisor
    await supervisor.stop_all()  # an agent that wrongly accepted the id has started something
    await supervisor.close()


@pytest.mark.parametrize("replica_id", ["../../../outside", "a/../../outside", ".hidden", "/abs", "a b", ""])
async def test_l6_agent_refuses_a_replica_id_that_is_not_a_name(
    sup: Supervisor, tmp_path: Path, replica_id: str
) -> None:
    with pytest.raises(SpecError, match="is not a name"):
        sup.start(ShardSpec(replica_id=replica_id, model="m", engine="sim"))
    assert sup.shards == {}
    assert _names(tmp_path) == ["state"]  # nothing made beside the state dir
    assert _names(tmp_path / "state" / "work") == []


async def test_l6_controller_style_ids_are_accepted(sup: Supervisor) -> None:
    status = sup.start(ShardSpec(replica_id="gemma-3-270m-cpu-1a2b3c", model="m", engine="sim"))
    assert status.replica_id == "gemma-3-270m-cpu-1a2b3c"


async def test_l6_adopt_ignores_a_state_record_with_a_bad_replica_id(sup: Supervisor, tmp_path: Path) -> None:
    """A record naming a live engine (a real process, so only the id can make the agent pass it over)."""
    engine = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
    try:
        record = {
            "spec": {"replica_id": "../../x", "model": "m", "engine": "sim"},
            "status": {"replica_id": "../../x", "model": "m", "engine": "sim", "state": "ready"},
            "pid": engine.pid,
            "pgid": engine.pid,
            "start_ticks": await wait_for(lambda: proc_start_time(engine.pid), 10, "the engine's start time"),
        }
        (tmp_path / "state" / "shards" / "bad.json").write_text(json.dumps(record))
        assert sup.adopt() == [] and sup.shards == {}
    finally:
        engine.kill()
        await engine.wait()


@pytest.fixture
async def sim_url() -> AsyncIterator[str]:
    engine = SimEngine("m", LatencyConfig(), api_key="the-engine-key")
    runner = web.AppRunner(engine.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_l7_sim_engine_key_is_compared_in_constant_time(
    sim_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(sim.hmac, "compare_digest", spy)
    async with aiohttp.ClientSession() as session:
        for header, status in (
            ("Bearer the-engine-kez", 401),
            ("Bearer the-engine-key", 200),
            ("Bearer é", 401),
        ):
            async with session.get(f"{sim_url}/v1/models", headers={"Authorization": header}) as resp:
                assert resp.status == status, header
    assert len(compared) == 3 and compared[1] == (b"Bearer the-engine-key", b"Bearer the-engine-key")


@pytest.mark.integration
async def test_l7_router_debug_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The debug token unlocks the router's decision rationale: a wrong one gets no x-llmgw-decision, the right
    one does, and both go through hmac.compare_digest."""
    from llmgw_router.app import serve
    from llmgw_router.path.auth import Authenticator, StaticKeys
    from llmgw_router.path.ratelimit import memory_limiter
    from llmgw_router.path.service import Router, RouterOptions
    from router.helpers import endpoint, start_sim, wait_healthy_sync

    from llmgw.adapters.keys import hash_key
    from llmgw.core.snapshot import RouterSnapshot

    compared: list[bytes] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    key = "sk-llmgw-" + "a" * 43
    proc = start_sim("sim-chat", "engine-key-a")
    try:
        wait_healthy_sync([proc])
        snap = RouterSnapshot.model_validate(
            {
                "revision": "t",
                "models": {"sim-chat": {"context_length": 2048, "simulated": True}},
                "tenants": {"organizations": {"o": {}}, "projects": {"p1": {"organization": "o"}}},
                "endpoints": [endpoint(proc, "rep-a")],
            }
        )
        router = Router(
            RouterOptions(debug_token="the-debug-token"),
            auth=Authenticator(StaticKeys.from_file_lines([f"{hash_key(key)} p1 key-1"])),
            limiter=memory_limiter(lambda: __import__("time").time()),
        )
        router.apply_snapshot(snap)
        listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
        try:
            body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
            url = f"http://127.0.0.1:{listeners.api_port}/v1/chat/completions"
            async with aiohttp.ClientSession() as session:
                for token, shown in (("the-debug-tokem", False), ("the-debug-token", True)):
                    headers = {"Authorization": f"Bearer {key}", "x-llmgw-debug": token}
                    async with session.post(url, json=body, headers=headers) as resp:
                        assert resp.status == 200, await resp.text()
                        assert ("x-llmgw-decision" in resp.headers) is shown
        finally:
            await listeners.close()
    finally:
        proc.kill()
    assert compared.count(b"the-debug-token") == 2
