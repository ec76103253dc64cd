"""Helpers for the agent tests: process groups and file reads (waiting, ports, pids: tests/support.py)."""

from __future__ import annotations

import os


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def read_cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def part_files(directory: os.PathLike[str]) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(directory) for f in files if f.endswith(".part")]
