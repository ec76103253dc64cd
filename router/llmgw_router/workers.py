"""`llmgw-router --workers N`: N router processes behind one API port, supervised by this one.

Each worker is a whole router (its own event loop, controller link, scrape loop, limiter and usage writer),
started as `python -m llmgw_router --worker-seat SPEC` (main.py's entry: this module never imports main). Each
binds its own API socket on the same port with SO_REUSEPORT: the kernel spreads new connections over the
workers' accept queues evenly (one shared socket wakes every worker for each connection and the least busy loop
does not necessarily win), and a worker that dies takes only its own queue with it while the kernel sends new
connections to the others. The parent binds the port first, without listening, to resolve port 0 and to fail
early with a clear message; a listening socket is never held by a process that does not accept on it.

Each worker serves its metrics on a private loopback port it tells the parent through a pipe; the parent's
metrics listener scrapes them all and serves one page (`metrics_merge`). A worker that dies is logged once
with its exit status and started again (at once after a long life, with a growing delay when it keeps dying
young); one that cannot start at all (before the router ever served) stops it, as a bad flag would.
SIGTERM or SIGINT to the parent stops every worker with SIGTERM (each drains its requests as a single router
does) and exits when they have.

Limits stay whole across workers only through the store: `--workers` above 1 needs `--store`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from llmgw_router.metrics_merge import Merger, Page, parse_page

__all__ = ["WORKER_FLAG", "WorkerSeat", "supervise", "take_seat", "worker_count"]

log = logging.getLogger("llmgw_router.workers")

# `llmgw-router --worker-seat SPEC`: one of several workers, started by the supervisor (main.py reads it).
WORKER_FLAG = "--worker-seat"
STOP_TIMEOUT = 120.0  # a worker drains its requests (aiohttp's 60 s) and flushes usage before this
SCRAPE_TIMEOUT = 2.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def worker_count(ns: argparse.Namespace, snapshot_workers: int | None) -> int:
    """How many workers: `--workers`, else the snapshot's `router.workers`, else 1. SystemExit when more
    than one is asked for without a store (each worker would count every limit on its own: N times it)."""
    count = int(ns.workers) if getattr(ns, "workers", None) is not None else (snapshot_workers or 1)
    if count < 1:
        raise SystemExit(f"llmgw-router: --workers must be at least 1, got {count}")
    if count > 1 and not ns.store:
        raise SystemExit(
            f"llmgw-router: {count} workers need --store DSN: without a store each worker would count the "
            "rpm, tpm, concurrency and budget limits on its own, allowing N times each (sqlite:///FILE "
            "is enough on one machine); or run one worker"
        )
    return count


# ---------------------------------------------------------------------------------------------- worker side


def _reuseport_socket(host: str, port: int, *, listen: bool) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(1024)
            sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class WorkerSeat:
    """What a worker is told by its parent: its index, the API port to share, where to report."""

    index: int
    host: str
    port: int
    report_fd: int
    parent_pid: int

    def sockets(self) -> dict[str, socket.socket]:
        """The worker's own SO_REUSEPORT API socket and a private loopback metrics socket (`serve`'s)."""
        return {
            "api_socket": _reuseport_socket(self.host, self.port, listen=True),
            "metrics_socket": _loopback_listener(),
        }

    def report(self, metrics_port: int) -> None:
        """Tell the parent this worker serves, and where its metrics are."""
        with os.fdopen(self.report_fd, "w") as out:
            out.write(json.dumps({"metrics_port": metrics_port, "pid": os.getpid()}) + "\n")


def _loopback_listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def take_seat(spec: str) -> tuple[argparse.Namespace, WorkerSeat]:
    """In a worker (main.py, `--worker-seat SPEC`): the parent's flags and this worker's seat, from the one
    argument `_Supervisor.spec` wrote. The worker is asked to stop when its parent dies."""
    given = json.loads(spec)
    seat = WorkerSeat(**given["seat"])
    _die_with_parent(seat.parent_pid)
    return argparse.Namespace(**given["ns"]), seat


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM (a drain) when the supervising process dies, even by SIGKILL: no orphan keeps the port."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        raise SystemExit("llmgw-router worker: the supervising process is gone")


# ---------------------------------------------------------------------------------------------- parent side


@dataclass
class _Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    metrics_port: int | None = None
    started: float = 0.0
    last_page: Page | None = None
    delay: float = 0.0


@dataclass
class _Supervisor:
    ns: argparse.Namespace
    count: int
    host: str
    port: int
    workers: list[_Worker] = field(default_factory=list)
    merger: Merger = field(default_factory=Merger)
    stopping: bool = False
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=False))

    def __post_init__(self) -> None:
        self.workers = [_Worker(i) for i in range(self.count)]
        self.restarts = Counter(
            "llmgw_router_worker_restarts",
            "Router workers started again after they exited",
            registry=self.registry,
        )
        self.up = Gauge("llmgw_router_workers", "Router workers serving now", registry=self.registry)
        self.up.set_function(lambda: sum(1 for w in self.workers if w.metrics_port is not None))

    def spec(self, w: _Worker, report_fd: int) -> str:
        ns = dict(vars(self.ns))
        ns["workers"] = 1
        ns["usage_spool"] = (
            str(_suffixed(Path(ns["usage_spool"]), w.index)) if ns.get("usage_spool") else None
        )
        if ns.get("usage_spool") is None:
            base = Path(ns["state_dir"]) / "usage-spool" / ns["router_id"]
            ns["usage_spool"] = str(_suffixed(base.absolute(), w.index))
        grace = Path(ns["state_dir"]) / "grace" / f"{ns['router_id']}.jsonl"
        ns["grace_file"] = str(_suffixed(grace.absolute(), w.index))
        seat = {
            "index": w.index,
            "host": self.host,
            "port": self.port,
            "report_fd": report_fd,
            "parent_pid": os.getpid(),
        }
        return json.dumps({"ns": ns, "seat": seat}, default=str)

    async def start(self, w: _Worker) -> bool:
        """Start one worker and wait until it reports; False when it exited first."""
        read_fd, write_fd = os.pipe()
        try:
            w.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "llmgw_router",
                WORKER_FLAG,
                self.spec(w, write_fd),
                pass_fds=(write_fd,),
                # Its own session: a terminal's Ctrl-C reaches the parent only, which stops the workers
                # in order, instead of racing them (a worker ending first would be started again).
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        w.started = time.monotonic()
        line = await _read_line(read_fd)
        try:
            info = json.loads(line)
            w.metrics_port = int(info["metrics_port"])
        except (ValueError, KeyError, TypeError):
            return False
        return True

    async def keep(self, w: _Worker) -> None:
        """Run one worker for as long as the router runs, starting it again when it exits."""
        while not self.stopping:
            if w.proc is None:
                await self.start(w)
            status = await _status(w)
            w.metrics_port = None
            self.merger.retire(w.last_page)
            w.last_page, w.proc = None, None
            if self.stopping:
                return
            lived = time.monotonic() - w.started
            w.delay = 0.0 if lived > 10.0 else min(30.0, max(0.5, w.delay * 2))
            log.warning(
                "router worker %d exited with %s; starting it again%s",
                w.index,
                _describe(status),
                f" in {w.delay:.1f}s" if w.delay else "",
            )
            self.restarts.inc()
            await asyncio.sleep(w.delay)

    async def stop(self) -> None:
        self.stopping = True
        live = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                await asyncio.gather(*(p.wait() for p in live))
        except TimeoutError:
            for proc in live:
                if proc.returncode is None:
                    log.warning(
                        "router worker pid %d did not stop in %.0fs; killing it", proc.pid, STOP_TIMEOUT
                    )
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()

    async def metrics_page(self, session: aiohttp.ClientSession) -> bytes:
        async def scrape(w: _Worker) -> tuple[_Worker, Page | None]:
            if w.metrics_port is None:
                return w, None
            try:
                url = f"http://127.0.0.1:{w.metrics_port}/metrics"
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)) as resp:
                    return w, parse_page(await resp.text())
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return w, None

        answers = await asyncio.gather(*(scrape(w) for w in self.workers))
        live: list[Page] = []
        stale: list[Page] = []
        for w, page in answers:
            if page is not None:
                w.last_page = page
                live.append(page)
            elif w.last_page is not None:
                stale.append(w.last_page)
        return self.merger.merge(live, stale) + generate_latest(self.registry)


def _suffixed(path: Path, index: int) -> Path:
    """Worker 0 keeps the one-process router's file (a router going from 1 worker to N keeps its spool and
    grace ledger); worker k > 0 gets NAME.wK beside it."""
    if index == 0:
        return path
    return path.with_name(f"{path.name}.w{index}")


async def _read_line(fd: int) -> str:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
    )
    try:
        return (await reader.readline()).decode()
    finally:
        transport.close()


async def _status(w: _Worker) -> int:
    assert w.proc is not None
    return await w.proc.wait()


def _describe(status: int) -> str:
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-status).name}"
    return f"status {status}"


async def supervise(ns: argparse.Namespace, count: int, listen: str, metrics_listen: str) -> int:
    """Run `count` workers sharing `listen`, and the merged metrics on `metrics_listen`, until SIGTERM or
    SIGINT. The exit status: 0, or the status of a worker that could not start."""
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        reserve = _reuseport_socket(host, int(port_text), listen=False)
    except OSError as exc:
        raise SystemExit(f"llmgw-router: cannot listen on {listen}: {exc.strerror or exc}") from None
    sup = _Supervisor(ns, count, host, int(reserve.getsockname()[1]))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(reserve.close)
        session = await stack.enter_async_context(aiohttp.ClientSession())
        runner = await _serve_metrics(sup, session, metrics_listen)
        stack.push_async_callback(runner.cleanup)
        started = await asyncio.gather(*(sup.start(w) for w in sup.workers))
        if not all(started):
            await sup.stop()
            return next((w.proc.returncode for w in sup.workers if w.proc and w.proc.returncode), 1) or 1
        tasks = [asyncio.create_task(sup.keep(w)) for w in sup.workers]
        mport = runner.addresses[0][1] if runner.addresses else metrics_listen
        print(
            f"llmgw-router listening on {host}:{sup.port} with {count} workers "
            f"(api port {sup.port}, metrics port {mport})",
            flush=True,
        )
        await stop.wait()
        await sup.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return 0


async def _serve_metrics(sup: _Supervisor, session: aiohttp.ClientSession, address: str) -> web.AppRunner:
    async def metrics(request: web.Request) -> web.Response:
        body = await sup.metrics_page(session)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    await web.TCPSite(runner, host.strip("[]") or "127.0.0.1", int(port)).start()
    return runner


def run_supervisor(ns: argparse.Namespace, count: int, listen: str, metrics_listen: str) -> None:
    status = asyncio.run(supervise(ns, count, listen, metrics_listen))
    if status:
        raise SystemExit(status if status > 0 else 1)
