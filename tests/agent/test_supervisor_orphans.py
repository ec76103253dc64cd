"""An engine whose group leader (the pass-through in front of it) died is not left running: it would keep its
port and memory with nobody supervising it, and the replacement would be refused that port."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from llmgw_agent.engine_memory import process_groups
from llmgw_agent.engine_process import group_alive
from llmgw_agent.protocol import ShardSpec, ShardStatus
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import free_port_range, wait_for

pytestmark = pytest.mark.integration


async def test_an_engine_whose_pass_through_was_killed_is_not_left_running(tmp_path: Path) -> None:
    lo = free_port_range(10)
    cfg = SupervisorConfig(
        state_dir=tmp_path,
        advertise_host="127.0.0.1",
        port_range=(lo, lo + 9),
        ready_timeout_s=60,
        stop_grace_s=1,
        poll_interval_s=0.05,
    )
    sup = Supervisor(cfg, lambda _status: None)
    try:
        sup.start(ShardSpec(replica_id="orphan", model="m", engine="sim", api_key="key-0123456789"))
        ready: ShardStatus = await wait_for(
            lambda: next((s for s in sup.statuses() if s.state in ("ready", "failed")), None), 60, "ready"
        )
        assert ready.state == "ready" and ready.pid is not None, ready.last_output_lines
        leader = ready.pid
        members = [pid for pid, (group, _) in process_groups().items() if group == leader and pid != leader]
        assert members, "the sim engine runs under its pass-through, in the same group"
        os.kill(leader, signal.SIGKILL)
        failed: ShardStatus = await wait_for(
            lambda: next((s for s in sup.statuses() if s.state == "failed"), None), 30, "failed"
        )
        assert "killed by SIGKILL" in failed.message
        await wait_for(lambda: not group_alive(leader), 10, "the engine gone with its pass-through")
    finally:
        await sup.stop_all()
        await sup.close()
