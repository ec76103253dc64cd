"""Helpers every test directory shares: a free loopback port and waiting for a condition with a deadline.

Imported as `from support import ...`: tests/ has no __init__.py, so pytest's rootdir-based import mode puts
tests/ itself on sys.path (the same way tests/gitops imports `controller.helpers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

# Under pytest-xdist (`--dist loadgroup`), the modules whose agents take engine ports from the agent's default
# range (20000-20999), which no test can move: an agent bootstrapped over SSH and `llmgw up`'s own. Two such
# agents at once on one machine pick the same free port before either engine binds it. The bootstrapped ones also
# share the machine's one `llmgw` account (created by the first). One worker runs them all, one at a time.
# With the locked pytest 9.2 and pytest-xdist 3.8 the group holds only through tests/conftest.py's
# pytest_collection_modifyitems (pytest-xdist issue 1386: seen without it, two `llmgw up` at once on gw1 and gw3).
DEFAULT_AGENT_PORTS = pytest.mark.xdist_group("default-agent-ports")


def worker_name() -> str:
    """This pytest process's name under pytest-xdist (`gw0`, `gw1`, ...), `main` when not run by xdist: for what is
    global on the machine (a cache directory, a name) and must differ between workers running at once."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def worker_cache(name: str) -> Path:
    """`name` under llmgw's cache (LLMGW_CACHE, else ~/.cache/llmgw), kept across sessions, one per xdist worker:
    a worker rebuilding it (rmtree, then replace) must not pull it from under another worker's test."""
    root = Path(os.environ.get("LLMGW_CACHE", Path.home() / ".cache" / "llmgw"))
    return root / f"{name}-{worker_name()}"


def _ephemeral_ports() -> range:
    """The ports the kernel hands out for port 0 and for outgoing connections (Linux: ip_local_port_range,
    32768-60999 by default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(word) for word in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def _worker_slice(ports: range) -> range:
    """This pytest process's part of `ports`: under pytest-xdist each worker owns one consecutive slice (gw0 the
    first, ...); all of it when not under xdist."""
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    name = worker_name()
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    width = len(ports) // count
    return range(ports.start + index * width, ports.start + (index + 1) * width)


def _single_ports() -> range:
    """Where `free_port` takes its ports: above the agent's default engine range (20000-20999) and below the
    kernel's ephemeral range. A port the kernel could hand out was once taken, between the check and a
    router's bind, by an outgoing connection of another test (CI: a router's port already in use)."""
    return range(21000, min(_ephemeral_ports().start, 32768))


def port_share() -> range:
    """The ports `free_port` may hand out in this process: its worker's slice, so two workers asking at the
    same moment are never handed the same port."""
    return _worker_slice(_single_ports())


# From a random point: two test runs at once on one machine (a developer's beside CI's) do not walk the same
# ports in step.
_port_numbers = itertools.count(random.randrange(1 << 16))


def free_port() -> int:
    """A port nothing listens on right now, from this worker's `port_share`, taken in turn round the share: the
    longest time before one is handed out again (two engines told the same port leave one of them answering
    for both; seen once: an engine refusing the other's key)."""
    share = port_share()
    for _ in range(len(share)):
        port = share.start + next(_port_numbers) % len(share)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # something listens there (a test's engine not yet gone, another program)
        return port
    raise RuntimeError(f"no free loopback port in {share}")


# Where `free_port_range` takes its blocks: below the kernel's ephemeral range, so no port the kernel hands out
# (an outgoing connection) lands in a block, and below the agent's default engine range (20000-20999).
BLOCK_PORTS = range(10000, 20000)
# Blocks go round this worker's slice in order: the longest time before one is handed out again.
_block_numbers = itertools.count()


def free_port_range(count: int) -> int:
    """The first of `count` consecutive ports that are all free to bind now, from this worker's slice of
    BLOCK_PORTS (as `port_share` slices its own range): a block an agent picks its engines' ports from,
    which no other worker's agent picks from at the same time."""
    share = _worker_slice(BLOCK_PORTS)
    blocks = len(share) // count
    for _ in range(blocks):
        lo = share.start + (next(_block_numbers) % blocks) * count
        try:
            with contextlib.ExitStack() as stack:
                for port in range(lo, lo + count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue  # something listens there still (a test's engine not yet gone, another program)
        return lo
    raise AssertionError(f"no {count} consecutive free ports in {share}")


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
    """The operator's secret binding map (llmgw.core.config.secret_bindings) in `secrets_dir`: one line per secret,
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
