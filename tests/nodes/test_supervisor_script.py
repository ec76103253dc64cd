"""The supervise loop and its stop command, as bootstrap renders them for a node without systemd, run here by
/bin/sh on a stand-in agent: stopping leaves nothing of the loop's process group running, also when the
agent ignores SIGTERM (an agent left running from a removed node's deleted files: issue 34)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
from fixtures.leftover_check import snapshot
from support import wait_until

from llmgw.adapters.ssh import render

STAND_INS = {
    "stops-on-term": "#!/bin/sh\nexec sleep 600\n",
    # Ignores SIGTERM, as an agent stuck in its shutdown would, and has a child of its own.
    "ignores-term": "#!/bin/sh\ntrap '' TERM\nsleep 601 &\nexec sleep 602\n",
}


def _install(prefix: Path, agent: str) -> render.Layout:
    layout = render.Layout(prefix=str(prefix))
    scripts = {layout.agent_bin: agent.encode(), layout.supervisor: render.supervisor_script(layout, 1)}
    for path, text in scripts.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(text)
        Path(path).chmod(0o755)
    return layout


def _sh(script: str) -> str:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, timeout=60).stdout


def _group(pgid: int) -> list[int]:
    """The running (not zombie) processes of process group `pgid`."""
    return [p.pid for p in snapshot(details=False) if p.pgid == pgid and not p.zombie]


@pytest.mark.parametrize("agent", sorted(STAND_INS))
def test_stopping_the_supervisor_leaves_nothing_of_its_group_running(tmp_path: Path, agent: str) -> None:
    layout = _install(tmp_path / "opt-llmgw", STAND_INS[agent])
    _sh(render.start_supervisor_command(layout))
    supervisor = int(Path(layout.supervisor_pid).read_text())
    try:
        expected = 3 if agent == "ignores-term" else 2  # the loop, the agent (and its child)
        wait_until(lambda: len(_group(supervisor)) == expected, 10, "the agent running under its supervisor")
        assert _sh(render.stop_supervisor_command(layout)).split() == ["stopped"]
        assert wait_until(lambda: not _group(supervisor), 5, "nothing of the group left") is True
        assert not Path(layout.supervisor_pid).exists()
        assert _sh(render.stop_supervisor_command(layout)) == ""  # nothing to stop a second time
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(supervisor, signal.SIGKILL)
