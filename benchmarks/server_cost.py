"""Whole servers' instructions per request under callgrind: llmgw-router (every check on) beside the floor.

request_path_cost.py counts the request path between a fake client and a fake engine; the floor of
router_overhead.py (peers.FLOOR, ~20 lines of aiohttp) has no request path apart from its server and client,
so the two are compared as whole servers, each run the same way: the server's own process (llmgw-router with
the snapshot of every check on and a SQLite store, as peers.start_llmgw starts it; or peers.FLOOR as is) under
`valgrind --tool=callgrind` with PYTHONHASHSEED fixed, its listener and its engine client real, reached over
loopback by a client in this process (keep-alive, one request at a time) and forwarding to
router_overhead.py's mock in a process of its own; neither is counted. The count of a batch of requests is
read from callgrind's dumps at two markers around it: a thread started before the server's code reads a pipe,
and for each byte written to it calls `os.getppid()` (`--dump-before=getppid`) and answers. A batch ends when
the server's CPU time stops moving (its answer's bytes leave before its accounting is done), and an idle
segment of the same wait, measured alike, is taken off (the marker's own cost and the server's timers).

What differs from the in-process driver: real sockets (the listener's parsing and the engine client are
counted; the system calls are not, callgrind sees user space), the usage writer's batches on their own 1 s
interval (a flush lands in a batch by time, so about one per second of callgrind's slowed run), the limits
on real time, and the scrape loop's interval set to an hour so that no scrape lands in a batch (each engine
scraped once at start, and stale_after as long). One request at a time: at c=16 both servers amortise their
event loop's wakeups over more requests, which this does not show.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import every_check
from harness import Procs, free_ports, tree_cpu_seconds, wait_http
from peers import FLOOR, _make_store_key
from router_overhead import request_body, start_mock

MARKED = r"""
import os, runpy, sys, threading
cmds, acks = int(os.environ.pop("COST_CMD_FD")), int(os.environ.pop("COST_ACK_FD"))
def marks():
    while os.read(cmds, 1):
        os.getppid()  # callgrind dumps here
        os.write(acks, b"k")
threading.Thread(target=marks, daemon=True).start()
target, sys.argv = sys.argv[1], sys.argv[1:]
if target.endswith(".py"):
    runpy.run_path(target, run_name="__main__")
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
"""
SEED = "0"
QUIET_S = 1.5  # a batch ends once the server's CPU time has not moved for this long (past the usage flush)
START_S = 600.0  # starting under callgrind: imports run fifty times slower


class Marked:
    """A server under callgrind whose counts are dumped at each mark()."""

    def __init__(self, work: Path, argv: list[str], url: str) -> None:
        self.work = work
        (work / "marked.py").write_text(MARKED)
        cmd_r, self._cmd_w = os.pipe()
        self._ack_r, ack_w = os.pipe()
        env = dict(os.environ, PYTHONHASHSEED=SEED, COST_CMD_FD=str(cmd_r), COST_ACK_FD=str(ack_w))
        env.pop("PYTHONDEVMODE", None)
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # tracing configured without an endpoint
        vg = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work / 'cg.out'}"]
        vg += ["--dump-before=getppid", "--collect-jumps=no", "--dump-instr=no"]
        with open(work / "server.log", "wb") as log:
            self.proc = subprocess.Popen(
                [*vg, sys.executable, str(work / "marked.py"), *argv],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(cmd_r, ack_w),
                start_new_session=True,
            )
        os.close(cmd_r)
        os.close(ack_w)
        self.marks = 0
        wait_http(url, limit_s=START_S, proc=self.proc)

    def mark(self) -> None:
        os.write(self._cmd_w, b"m")
        if os.read(self._ack_r, 1) != b"k":
            raise SystemExit(f"server_cost: the server under callgrind stopped ({self.log_tail()})")
        self.marks += 1

    def quiet(self) -> None:
        """Wait until the server's CPU time stops moving: what a batch's requests left to do is done."""
        last, since = tree_cpu_seconds(self.proc.pid), time.monotonic()
        while time.monotonic() - since < QUIET_S:
            time.sleep(0.1)
            now = tree_cpu_seconds(self.proc.pid)
            if now - last > 0.02:
                last, since = now, time.monotonic()

    def dumps(self) -> list[int]:
        """Each dump's total instructions, in order (dump k: from mark k-1 to mark k)."""
        found = [p for p in self.work.glob("cg.out.*") if p.suffix[1:].isdigit()]
        totals = []
        for p in sorted(found, key=lambda p: int(p.suffix[1:])):
            m = re.search(r"^totals:\s+(\d+)", p.read_text(errors="replace"), re.M)
            if not m:
                raise SystemExit(f"server_cost: {p} has no totals line")
            totals.append(int(m.group(1)))
        return totals

    def log_tail(self) -> str:
        return " | ".join((self.work / "server.log").read_text(errors="replace").splitlines()[-5:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)
        os.close(self._cmd_w)
        os.close(self._ack_r)


def llmgw_argv(work: Path, upstream: str) -> tuple[list[str], str, dict[str, str]]:
    """llmgw-router's arguments as peers.start_llmgw gives them (every check on), its URL and headers."""
    dsn = f"sqlite:///{work / 'store.db'}"
    key = asyncio.run(_make_store_key(dsn))
    snap = every_check.snapshot(upstream)
    snap["router"] = {**snap["router"], "scrape_interval": "1h", "stale_after": "2h"}
    (work / "snapshot.json").write_text(json.dumps(snap))
    port, metrics_port = free_ports(2)
    argv = ["llmgw_router", "--snapshot", str(work / "snapshot.json"), "--store", dsn]
    argv += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    argv += ["--log-level", "WARNING", *every_check.ROUTER_FLAGS, "--state-dir", str(work / "state")]
    headers = {"Authorization": f"Bearer {key}", **every_check.REQUEST_HEADERS}
    return argv, f"http://127.0.0.1:{port}", headers


def floor_argv(work: Path, upstream: str) -> tuple[list[str], str, dict[str, str]]:
    (work / "floor.py").write_text(FLOOR)
    (port,) = free_ports(1)
    return [str(work / "floor.py"), str(port), upstream], f"http://127.0.0.1:{port}", {}


async def _batch(url: str, headers: dict[str, str], stream: bool, requests: int) -> None:
    import aiohttp

    body = json.dumps(request_body(stream)).encode()
    hdrs = {"Content-Type": "application/json", **headers}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for _ in range(requests):
            async with session.post(url + "/v1/chat/completions", data=body, headers=hdrs) as r:
                await r.read()
                if r.status != 200:
                    raise SystemExit(f"server_cost: {url} answered {r.status}")


def count(name: str, work: Path, upstream: str, requests: int, warmup: int) -> dict[str, float]:
    """One server's instructions per request, whole and streamed, its idle segment taken off."""
    work.mkdir(parents=True)
    argv, url, headers = (llmgw_argv if name == "llmgw" else floor_argv)(work, upstream)
    server = Marked(work, argv, url)
    try:
        labels = []
        for mode in ("whole", "stream", "idle"):
            if mode != "idle":
                asyncio.run(_batch(url, headers, mode == "stream", warmup))
            server.quiet()
            server.mark()
            labels.append("setup")
            if mode != "idle":
                asyncio.run(_batch(url, headers, mode == "stream", requests))
            server.quiet()
            server.mark()
            labels.append(mode)
        totals = server.dumps()
        if len(totals) < len(labels):
            raise SystemExit(
                f"server_cost: {len(totals)} dumps for {len(labels)} marks ({server.log_tail()})"
            )
        seg = dict(zip(labels, totals, strict=False))
        return {mode: (seg[mode] - seg["idle"]) / requests for mode in ("whole", "stream")}
    finally:
        server.stop()


def measure(work: Path, requests: int = 50, warmup: int = 20) -> dict[str, dict[str, float]]:
    """The floor's and llmgw-router's instructions per request, whole and streamed, against one mock."""
    procs = Procs(work)
    try:
        upstream = start_mock(procs, work, None)
        return {name: count(name, work / name, upstream, requests, warmup) for name in ("floor", "llmgw")}
    finally:
        procs.stop_all()


def ratio_lines(servers: dict[str, dict[str, float]], in_process: dict[str, int]) -> list[str]:
    """The table of both servers and the ratio line: llmgw's instructions over the floor's."""
    lines = [f"{'server':<26}{'whole instr':>14}{'stream instr':>14}"]
    for name, label in (("floor", "floor (aiohttp proxy)"), ("llmgw", "llmgw-router (every check)")):
        lines.append(f"{label:<26}" + "".join(f"{servers[name][m]:>14,.0f}" for m in ("whole", "stream")))
    rest = {m: servers["llmgw"][m] - in_process[m] for m in ("whole", "stream")}
    lines.append(
        f"{'  of which listener+client':<26}"
        + "".join(f"{rest[m]:>14,.0f}" for m in ("whole", "stream"))
        + "  (llmgw-router's count less the in-process request path's)"
    )
    r = {m: servers["llmgw"][m] / servers["floor"][m] for m in ("whole", "stream")}
    lines.append(
        f"request_path_floor: instr_ratio_whole={r['whole']:.2f} instr_ratio_stream={r['stream']:.2f}"
    )
    return lines


def main(argv: Any = None) -> None:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--requests", type=int, default=50)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llmgw-server-cost-") as tmp:
        servers = measure(Path(tmp), args.requests)
    print(json.dumps(servers, indent=2))


if __name__ == "__main__":
    main()
