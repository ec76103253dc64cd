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

from llmgw.adapters.ssh import render

STOP_LIMIT_S = 30.0  # the supervisor gives its agent 10 s before SIGKILL; a loaded machine gets the rest


def _fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the name, or None when no such process runs (a zombie has ended)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields


def _table() -> dict[int, tuple[int, list[bytes]]]:
    """pid -> (parent pid, argv) of every running process."""
    rows = {}
    for proc in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if (fields := _fields(int(proc.name))) is not None:
                rows[int(proc.name)] = (int(fields[1]), args)
    return rows


def agent_processes(layout: render.Layout) -> list[int]:
    """The supervisors and agents running from `layout`'s prefix (not its engines: they outlive agents)."""
    mine = {layout.supervisor.encode(), layout.agent_bin.encode()}
    return sorted(pid for pid, (_, args) in _table().items() if mine & set(args))


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
    table = _table()
    described = [
        f"{pid}: {b' '.join(table[pid][1]).decode(errors='replace')}" for pid in left if pid in table
    ]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"still running {STOP_LIMIT_S:.0f}s after SIGTERM to the supervisor: {described}")
