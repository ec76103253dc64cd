"""Helpers every test directory shares: a free loopback port and waiting for a condition with a deadline.

Imported as `from support import ...`: tests/ has no __init__.py, so pytest's rootdir-based import mode puts
tests/ itself on sys.path (the same way tests/gitops imports `controller.helpers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on right now, picked by the kernel (bind to port 0 on loopback), and never one
    this test process was given before: the kernel may hand the same free port to two calls in a row, and two
    engines told the same port leave one of them answering for both (seen: an engine refusing the other's key)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no fresh loopback port after 100 tries")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs. A zombie (exited, not yet reaped by its parent) does not: it
    serves nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _timed_out(limit_s: float, what: str, last: Any) -> AssertionError:
    return AssertionError(f"timed out after {limit_s}s waiting for {what} (last: {last!r})")


async def wait_for(
    predicate: Callable[[], Any], limit_s: float = 30.0, what: str = "condition", *, interval: float = 0.02
) -> Any:
    """Poll `predicate` (plain or returning an awaitable) until it gives something truthy and return that;
    at the deadline fail naming `what` and the last value seen."""
    deadline = time.monotonic() + limit_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(limit_s, what, value)
        await asyncio.sleep(interval)


def wait_until(predicate: Callable[[], Any], limit_s: float, what: str, *, interval: float = 0.05) -> Any:
    """`wait_for` for synchronous tests (blocks the thread): poll until truthy, return the value."""
    deadline = time.monotonic() + limit_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(limit_s, what, value)
        time.sleep(interval)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    """Serve an aiohttp app on a free loopback port for the block; yields the port."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def write_bindings(secrets_dir: Path, lines: list[str]) -> Path:
    """The operator's secret binding map (llmgw.core.secret_bindings) in `secrets_dir`: one line per secret,
    e.g. `hf-token: {purposes: [source-token], hosts: [huggingface.co]}`."""
    secrets_dir.mkdir(parents=True, exist_ok=True)
    path = secrets_dir / "bindings.yaml"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def answering(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """Serve `handler` for every method and path on a free loopback port for the block; yields the base URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with serving(app) as port:
        yield f"http://127.0.0.1:{port}"
