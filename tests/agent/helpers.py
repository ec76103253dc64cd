"""Small helpers for the agent tests: wait for a condition with a deadline, free ports, process checks."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(
    predicate: Callable[[], T | Awaitable[T | None] | None], limit_s: float = 20.0, what: str = "condition"
) -> T:
    """Poll `predicate` (sync or async) until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + limit_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return value  # truthy, so not None
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s}s waiting for {what}")
        await asyncio.sleep(0.02)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
