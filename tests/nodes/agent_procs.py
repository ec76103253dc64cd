"""Stopping the agent a test installed under a prefix on this machine, in its teardown.

A teardown that only signals the supervisor and moves on cannot tell a supervisor that stopped from one that
did not; removing the prefix then leaves an agent running from deleted files (issue 34). `stop_agent` waits
for the supervisor and its agent to end, and fails the test, after killing them, when SIGTERM did not."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from fixtures.leftover_check import snapshot

from llmgw.adapters.ssh import render

STOP_LIMIT_S = 30.0  # the supervisor gives its agent 10 s before SIGKILL; a loaded machine gets the rest


def agent_processes(layout: render.Layout) -> list[int]:
    """The supervisors and agents running from `layout`'s prefix (not its engines: they outlive agents)."""
    mine = {layout.supervisor, layout.agent_bin}
    return sorted(p.pid for p in snapshot(details=False) if not p.zombie and mine & set(p.cmdline))


def stop_agent(layout: render.Layout) -> None:
    """SIGTERM the supervisor the pid file names, as `llmgw node teardown` does, and wait for it and its agent
    to end. What still runs from the prefix after that is killed, and the test fails naming it."""
    with contextlib.suppress(OSError, ValueError, ProcessLookupError):
        os.kill(int(Path(layout.supervisor_pid).read_text()), signal.SIGTERM)
    deadline = time.monotonic() + STOP_LIMIT_S
    while (left := agent_processes(layout)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not left:
        return
    described = [f"{p.pid}: {' '.join(p.cmdline)}" for p in snapshot(details=False) if p.pid in left]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"still running {STOP_LIMIT_S:.0f}s after SIGTERM to the supervisor: {described}")
