"""Supervisor edge cases: SIGKILL after the grace, the whole group, ready deadline, pid reuse, the protocol."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llmgw_agent.engine_process import proc_start_time, tail_lines
from llmgw_agent.protocol import (
    Command,
    Gpu,
    Heartbeat,
    Inventory,
    Register,
    ShardSpec,
    ShardStatus,
    dump,
    parse_agent_message,
    parse_controller_message,
)
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import free_port_range, pid_alive, wait_for

from .helpers import group_alive

# An "engine" that ignores SIGTERM and has a child of its own: only SIGKILL to the group ends both.
STUBBORN = r"""
import http.server, os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
port = int(sys.argv[sys.argv.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
print(f"child {child.pid}", flush=True)
if os.environ.get("VLLM_TEST_NEVER_READY"):  # a tuning-style name: the agent passes only those
    signal.pause()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
async def sup(tmp_path: Path) -> AsyncIterator[tuple[Supervisor, list[ShardStatus]]]:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    wrapper = tmp_path / "fake-vllm"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    wrapper.chmod(0o755)
    updates: list[ShardStatus] = []
    ports = free_port_range(100)
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        port_range=(ports, ports + 99),
        engine_binaries={"vllm": str(wrapper)},
        ready_timeout_s=60,  # the machine may be busy: only the deadline test shortens it
        stop_grace_s=0.5,
        poll_interval_s=0.05,
    )
    s = Supervisor(cfg, updates.append)
    yield s, updates
    await s.stop_all()
    await s.close()


def child_pid(lines: list[str]) -> int | None:
    for line in lines:
        if line.startswith("child "):
            return int(line.split()[1])
    return None


@pytest.mark.integration
async def test_sigkill_after_grace_takes_the_whole_group(sup: tuple[Supervisor, list[ShardStatus]]) -> None:
    s, _ = sup
    s.start(ShardSpec(replica_id="st", model="m", engine="vllm"))
    ready = await wait_for(
        lambda: next((x for x in s.statuses() if x.state in ("ready", "failed")), None), limit_s=20
    )
    assert ready.state == "ready", ready.last_output_lines
    child: int = await wait_for(
        lambda: child_pid(s.statuses()[0].last_output_lines), limit_s=20, what="child pid"
    )
    assert ready.pid is not None and pid_alive(child)
    (stopped,) = await s.stop("st")
    assert stopped.state == "stopped"
    assert any("ignoring SIGTERM" in line for line in stopped.last_output_lines)  # TERM came first
    assert not group_alive(ready.pid) and not pid_alive(child)


@pytest.mark.integration
async def test_not_ready_by_the_deadline_fails_and_leaves_nothing(
    sup: tuple[Supervisor, list[ShardStatus]],
) -> None:
    s, updates = sup
    s.cfg.ready_timeout_s = 2
    s.start(ShardSpec(replica_id="slow", model="m", engine="vllm", env={"VLLM_TEST_NEVER_READY": "1"}))
    failed = await wait_for(lambda: next((u for u in updates if u.state == "failed"), None), limit_s=20)
    assert "not ready within 2s" in failed.message
    starting = next(u for u in updates if u.pid)
    assert starting.pid is not None and not group_alive(starting.pid)


async def test_recycled_pid_is_not_adopted_or_signalled(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "shards").mkdir(parents=True)
    me = os.getpid()
    ticks = proc_start_time(me)
    assert ticks is not None
    spec = ShardSpec(replica_id="old", model="m", engine="sim")
    status = ShardStatus(replica_id="old", model="m", engine="sim", state="ready", pid=me)
    record = {
        "spec": spec.model_dump(),
        "status": status.model_dump(),
        "pid": me,
        "pgid": me,
        "start_ticks": ticks + 1,
    }
    (state / "shards" / "old-0.json").write_text(json.dumps(record))
    s = Supervisor(SupervisorConfig(state_dir=state, advertise_host="127.0.0.1"), lambda _: None)
    assert s.adopt() == []  # same pid, another start time: a different process
    assert not (state / "shards" / "old-0.json").exists()
    assert pid_alive(me)


def test_tail_lines_keeps_the_last_fifty(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    out.write_text("".join(f"line {i}\n" for i in range(200)))
    lines = tail_lines(out)
    assert len(lines) == 50 and lines[-1] == "line 199" and lines[0] == "line 150"
    assert tail_lines(tmp_path / "missing") == []


def test_protocol_round_trip() -> None:
    inv = Inventory(cpu_cores=8, gpus=[Gpu(index=0, gpu_class="h100-80g", utilisation=None)])
    reg = Register(node="n", agent_version="0.1.0", inventory=inv)
    parsed = parse_agent_message(dump(reg))
    assert isinstance(parsed, Register) and parsed.inventory.gpus is not None
    assert parsed.inventory.gpus[0].gpu_class == "h100-80g" and parsed.inventory.memory_bytes is None
    assert isinstance(parse_agent_message(dump(Heartbeat())), Heartbeat)
    cmd = parse_controller_message(
        '{"type": "command", "id": "1", "action": "start_shard", "new_field": 1,'
        ' "spec": {"replica_id": "r", "model": "m", "engine": "llamacpp", "api_key": "k-9f8e7d"}}'
    )
    assert isinstance(cmd, Command) and cmd.spec is not None and cmd.spec.shard_id == "r-0"
    assert "k-9f8e7d" not in repr(cmd.spec)  # the key stays out of reprs (and so out of logs)


async def test_a_shard_reports_the_gpus_of_its_spec_and_keeps_them_in_its_record(
    sup: tuple[Supervisor, list[ShardStatus]],
) -> None:
    s, updates = sup
    first = s.start(ShardSpec(replica_id="g", model="m", engine="vllm", gpus=[1, 3]))
    assert first.gpus == [1, 3] and updates[0].gpus == [1, 3]
    record_file = s.cfg.state_dir / "shards" / "g-0.json"
    await wait_for(lambda: record_file.exists(), limit_s=20, what="the shard's state record")
    record = json.loads(record_file.read_text())
    assert record["spec"]["gpus"] == [1, 3] and record["status"]["gpus"] == [1, 3]


async def test_an_adopted_shard_reports_its_specs_gpus_even_from_an_older_record(tmp_path: Path) -> None:
    # A record an older agent wrote: its status has no `gpus`, its spec has. This process stands in for the
    # engine (same pid and start time), so it is adopted; the supervisor is closed, never told to stop it.
    state = tmp_path / "state"
    (state / "shards").mkdir(parents=True)
    me = os.getpid()
    spec = ShardSpec(replica_id="old", model="m", engine="sim", gpus=[0, 2])
    status = ShardStatus(replica_id="old", model="m", engine="sim", state="ready", pid=me).model_dump()
    del status["gpus"]
    record = {
        "spec": spec.model_dump(),
        "status": status,
        "pid": me,
        "pgid": me,
        "start_ticks": proc_start_time(me),
    }
    (state / "shards" / "old-0.json").write_text(json.dumps(record))
    s = Supervisor(SupervisorConfig(state_dir=state, advertise_host="127.0.0.1"), lambda _: None)
    try:
        (adopted,) = s.adopt()
        assert adopted.gpus == [0, 2]
        assert [x.gpus for x in s.statuses()] == [[0, 2]]
        assert parse_agent_message(dump(Heartbeat(shards=s.statuses()))).shards[0].gpus == [0, 2]  # type: ignore[union-attr]
    finally:
        await s.close()
