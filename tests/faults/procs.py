"""Processes the fault and fuzz suites need that the other helpers run in-process: a controller and a router
as real processes (so one can be killed with -9 and its open descriptors counted), and a fake engine whose
answers the test chooses, served from a thread so synchronous hypothesis tests can use it.

Sim engines and agents come from tests/router/helpers.py and tests/controller/helpers.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from aiohttp import web
from support import free_port, wait_until

from llmgw.adapters.keys import hash_key

# The controller's own entry point (`llmgw controller`) may not exist in every checkout; this runs the same
# `run_controller` the CLI wraps, stopping cleanly on SIGTERM (SIGKILL is the point of some tests).
_CONTROLLER_MAIN = """
import asyncio, json, logging, signal, sys
from llmgw.controller.app import run_controller
from llmgw.controller.parts.settings import ControllerOptions
logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
settings = ControllerOptions(**json.loads(sys.argv[1]))
async def main():
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await run_controller(settings, stop)
asyncio.run(main())
"""


def http_status(url: str, headers: dict[str, str] | None = None) -> int | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=3) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


@dataclass
class Proc:
    """A child process with its log file; `kill()` is SIGKILL, `stop()` SIGTERM then wait."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self) -> int:
        """SIGTERM and wait (a router's usage writer flushes on the way out); the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class ControllerProc(Proc):
    url: str = ""
    metrics_url: str = ""
    token: str = ""

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def start_controller_proc(log: Path, settings: dict[str, Any], token: str) -> ControllerProc:
    """A controller process on fresh loopback ports (set in `settings`); waits until /healthz answers."""
    port, mport = free_port(), free_port()
    values = dict(settings, listen=f"127.0.0.1:{port}", metrics_listen=f"127.0.0.1:{mport}")
    handle = log.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER_MAIN, json.dumps(values, default=str)],
        stdout=handle,
        stderr=handle,
    )
    c = ControllerProc(proc, log, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}", token)
    try:
        wait_until(lambda: http_status(c.url + "/healthz") == 200 or not c.alive(), 60, "controller /healthz")
    except AssertionError:
        c.kill()
        raise
    assert c.alive(), f"controller exited at start:\n{c.text()[-3000:]}"
    return c


@dataclass
class RouterProc(Proc):
    """A router process: `api` is its OpenAI API's base address, `metrics` its /metrics listener's."""

    api: str = ""
    metrics: str = ""

    @property
    def base_url(self) -> str:
        return self.api + "/v1"

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=60)


def start_router_proc(log: Path, args: list[str]) -> RouterProc:
    """`llmgw-router ARGS` on fresh ports; waits until /health answers. Unless ARGS name one, its state dir
    (usage spool, grace file) is beside its log, kept when the same log is reused for a restart: the default,
    `.llmgw/router` under the working directory, would be one spool for every router the suite runs at once."""
    port, mport = free_port(), free_port()
    handle = log.open("ab")
    state = [] if "--state-dir" in args else ["--state-dir", str(log.with_name(log.stem + "-state"))]
    argv = [
        sys.executable,
        "-c",
        "from llmgw_router.main import main; main()",
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-listen",
        f"127.0.0.1:{mport}",
        *state,
        *args,
    ]
    proc = subprocess.Popen(argv, stdout=handle, stderr=handle)
    r = RouterProc(proc, log, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}")
    try:
        wait_until(lambda: http_status(r.api + "/health") == 200 or not r.alive(), 60, "router /health")
    except AssertionError:
        r.kill()
        raise
    assert r.alive(), f"router exited at start:\n{r.text()[-3000:]}"
    return r


def start_router_following(tmp: Path, controllers: list[str], key: str) -> RouterProc:
    """A router process that takes its snapshots from `controllers` (in that order, with the admin token in
    tmp/token) and accepts one API key, `key`, for project p1 (key id key-1) from tmp/keys; its log is
    tmp/router.log. Returns once /health answers: the router has no endpoints until the controller sends them,
    so the caller waits for its model to be served."""
    keys = tmp / "keys"
    keys.write_text(f"{hash_key(key)} p1 key-1\n")
    follow = [arg for url in controllers for arg in ("--controller", url)]
    return start_router_proc(
        tmp / "router.log", [*follow, "--token-file", str(tmp / "token"), "--keys-file", str(keys)]
    )


Handler = Callable[[web.Request], Any]


@dataclass
class FakeEngine:
    """An engine stand-in in a thread: `behave` maps a path to an async handler the test swaps at will."""

    port: int = 0
    behave: dict[str, Handler] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        handler = self.behave.get(request.path)
        if handler is None:
            return web.json_response({"error": {"message": "not here"}}, status=404)
        result: web.StreamResponse = await handler(request)
        return result

    def start(self) -> FakeEngine:
        ready = threading.Event()
        self.port = free_port()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._dispatch)
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-engine", daemon=True)
        self._thread.start()
        assert ready.wait(10), "fake engine did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def raw_request(port: int, data: bytes, *, timeout: float = 10.0, pace: float = 0.0) -> bytes:
    """Send bytes on a fresh TCP connection (optionally one at a time, `pace` seconds apart); read the reply
    until the server closes or `timeout` passes. For requests no HTTP client library will send."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        if pace > 0:
            for i in range(len(data)):
                s.sendall(data[i : i + 1])
                time.sleep(pace)
        else:
            s.sendall(data)
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if _complete(b"".join(chunks)):
                    break
        return b"".join(chunks)


def _complete(reply: bytes) -> bool:
    head, sep, body = reply.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def status_of(reply: bytes) -> int:
    line = reply.split(b"\r\n", 1)[0]
    parts = line.split()
    assert len(parts) >= 2 and parts[0].startswith(b"HTTP/"), f"not an HTTP reply: {reply[:200]!r}"
    return int(parts[1])


def body_of(reply: bytes) -> bytes:
    return reply.partition(b"\r\n\r\n")[2]
