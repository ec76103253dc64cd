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
the server's CPU time stops moving (its answer's bytes leave before its accounting is done); the marker's own
cost and the server's timers are taken off (below).

What differs from the in-process driver: real sockets (the listener's parsing and the engine client are
counted; the system calls are not, callgrind sees user space) and the limits' windows on real time. What runs
on real time is counted like-for-like, not by where callgrind's fifty-fold slowed run happens to meet it:
- The usage writer flushes by count, as a router under load does (`UsageWriter`'s batch_size, 200 records,
  fill in a fifth of a second at c=16): its interval is an hour (`--usage-flush-interval`, a real setting)
  and each measured batch is batch_size requests, so it holds exactly one flush of a full batch (the spool's
  rotation and fsync, the rows inserted) whatever was pending when it began. The first warm-up is as long,
  so that the statements are compiled before any measured batch.
- The concurrency slots' background pass (after a 0.1 s linger idle slots go back to the store, and the next
  request asks for one again: store round trips a router at c=16 does not make, its slots stay busy) and
  their renewal every 10 s are pinned far off in the server process (`PooledSlots`' defaults, as the
  in-process driver pins them), so the slot stays held as under load; the key cache's expiry too
  (`--key-cache-ttl`, a real setting). At real speed these are a pass per 0.1 s and a store call per 10 s,
  no measurable share of a request at hundreds of requests a second.
- The timers that run anyway (the listener's sweep and the KV-event reconcile, once a second each) are taken
  off by time: two idle segments of different lengths give their instructions per second and the marker's
  own cost, and each batch loses the marker's cost and its own duration's worth of timers.
The scrape loop's interval is an hour so that no scrape lands in a batch (each engine scraped once at start,
and stale_after as long). One request at a time: at c=16 both servers amortise their event loop's wakeups
over more requests, which this does not show. `--runs N` measures both servers N times in a row and prints
each run and the spread (the largest of (max - min) / median over the four counts).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import statistics
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
if os.environ.pop("COST_PIN_SLOTS", None):  # the slots' linger and renewal far off: held as under load
    from llmgw.store.limits.slots import PooledSlots
    PooledSlots.__init__.__kwdefaults__.update(ttl=1e9, linger=1e9)
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
IDLE_LONG_S = 6.0  # the longer idle segment's extra wait: its timers' instructions per second


class Marked:
    """A server under callgrind whose counts are dumped at each mark()."""

    def __init__(self, work: Path, argv: list[str], url: str, pin_slots: bool) -> None:
        self.work = work
        (work / "marked.py").write_text(MARKED)
        cmd_r, self._cmd_w = os.pipe()
        self._ack_r, ack_w = os.pipe()
        env = dict(os.environ, PYTHONHASHSEED=SEED, COST_CMD_FD=str(cmd_r), COST_ACK_FD=str(ack_w))
        if pin_slots:
            env["COST_PIN_SLOTS"] = "1"
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
        self.marks: list[float] = []  # when each mark was answered (time.monotonic())
        wait_http(url, limit_s=START_S, proc=self.proc)

    def mark(self) -> float:
        """Dump the counts since the last mark; the seconds since it (the first: since nothing)."""
        os.write(self._cmd_w, b"m")
        if os.read(self._ack_r, 1) != b"k":
            raise SystemExit(f"server_cost: the server under callgrind stopped ({self.log_tail()})")
        self.marks.append(time.monotonic())
        return self.marks[-1] - self.marks[-2] if len(self.marks) > 1 else 0.0

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
    argv += ["--usage-flush-interval", "3600", "--key-cache-ttl", "3600"]  # flushes by count, see above
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


def batch_size() -> int:
    """The usage writer's batch: a measured batch is as many requests, so it holds one flush."""
    from llmgw.store.usage.usage_writer import UsageWriter

    size = inspect.signature(UsageWriter.__init__).parameters["batch_size"].default
    assert isinstance(size, int)
    return size


def count(name: str, work: Path, upstream: str, requests: int, warmup: int) -> dict[str, float]:
    """One server's instructions per request, whole and streamed, the marker and the timers taken off."""
    work.mkdir(parents=True)
    argv, url, headers = (llmgw_argv if name == "llmgw" else floor_argv)(work, upstream)
    server = Marked(work, argv, url, pin_slots=name == "llmgw")
    try:
        server.mark()  # start-up
        labels, seconds = [], []
        for mode, first in (("whole", requests), ("stream", warmup)):
            asyncio.run(_batch(url, headers, mode == "stream", first))
            server.quiet()
            seconds.append(server.mark())
            labels.append("setup")
            asyncio.run(_batch(url, headers, mode == "stream", requests))
            server.quiet()
            seconds.append(server.mark())
            labels.append(mode)
        for mode, extra in (("idle", 0.0), ("idle_long", IDLE_LONG_S)):
            time.sleep(extra)
            server.quiet()
            seconds.append(server.mark())
            labels.append(mode)
        totals = server.dumps()[1:]
        if len(totals) < len(labels):
            raise SystemExit(
                f"server_cost: {len(totals)} dumps for {len(labels)} marks ({server.log_tail()})"
            )
        seg = {k: (t, s) for k, t, s in zip(labels, totals, seconds, strict=False)}
        (idle, idle_s), (idle_long, idle_long_s) = seg["idle"], seg["idle_long"]
        per_s = (idle_long - idle) / (idle_long_s - idle_s)
        marker = idle - per_s * idle_s
        out = {m: (seg[m][0] - marker - per_s * seg[m][1]) / requests for m in ("whole", "stream")}
        return {**out, "timers_per_s": per_s, "marker": marker}
    finally:
        server.stop()


def measure(work: Path, requests: int | None = None, warmup: int = 20) -> dict[str, dict[str, float]]:
    """The floor's and llmgw-router's instructions per request, whole and streamed, against one mock."""
    work.mkdir(parents=True, exist_ok=True)
    procs = Procs(work)
    n = requests or batch_size()
    try:
        upstream = start_mock(procs, work, None)
        return {name: count(name, work / name, upstream, n, warmup) for name in ("floor", "llmgw")}
    finally:
        procs.stop_all()


def spread(runs: list[dict[str, dict[str, float]]]) -> str:
    """The largest (max - min) / median over the runs' four counts, in %; none for a single run."""
    if len(runs) < 2:
        return "none"
    worst = 0.0
    for name in ("floor", "llmgw"):
        for m in ("whole", "stream"):
            v = [r[name][m] for r in runs]
            worst = max(worst, (max(v) - min(v)) / statistics.median(v))
    return f"{100 * worst:.1f}%"


def median_run(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {n: {m: statistics.median(r[n][m] for r in runs) for m in ("whole", "stream")} for n in runs[0]}


def run_lines(runs: list[dict[str, dict[str, float]]]) -> list[str]:
    """Each run's four counts and its timers' rate."""
    lines = []
    for i, r in enumerate(runs, 1):
        f, g = r["floor"], r["llmgw"]
        timers = g.get("timers_per_s")  # counts recorded before it was measured have none
        shown = "not recorded" if timers is None else f"{timers:,.0f} instr/s taken off"
        lines.append(
            f"run {i}: floor {f['whole']:,.0f} / {f['stream']:,.0f}  llmgw {g['whole']:,.0f} / "
            f"{g['stream']:,.0f}  (whole / stream; timers {shown})"
        )
    return lines


def ratio_lines(
    runs: list[dict[str, dict[str, float]]], in_process: dict[str, int] | None = None
) -> list[str]:
    """The table of both servers (the runs' medians) and the ratio line: llmgw's instructions over the
    floor's, with the runs' spread."""
    servers = median_run(runs)
    lines = [*run_lines(runs), f"{'server':<26}{'whole instr':>14}{'stream instr':>14}"]
    for name, label in (("floor", "floor (aiohttp proxy)"), ("llmgw", "llmgw-router (every check)")):
        lines.append(f"{label:<26}" + "".join(f"{servers[name][m]:>14,.0f}" for m in ("whole", "stream")))
    if in_process is not None:
        rest = {m: servers["llmgw"][m] - in_process[m] for m in ("whole", "stream")}
        lines.append(
            f"{'  of which listener+client':<26}"
            + "".join(f"{rest[m]:>14,.0f}" for m in ("whole", "stream"))
            + "  (llmgw-router's count less the in-process request path's)"
        )
    r = {m: servers["llmgw"][m] / servers["floor"][m] for m in ("whole", "stream")}
    lines.append(
        f"request_path_floor: instr_ratio_whole={r['whole']:.2f} instr_ratio_stream={r['stream']:.2f}"
        f" spread={spread(runs)}"
    )
    return lines


def main(argv: Any = None) -> None:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--requests", type=int, help="per measured batch (default: the usage batch, one flush)")
    ap.add_argument("--runs", type=int, default=3, help="measure both servers this many times in a row")
    ap.add_argument("--keep", type=Path, help="keep each run's callgrind dumps under this directory")
    args = ap.parse_args(argv)
    runs = []
    for i in range(args.runs):
        if args.keep is not None:  # dump 3: the whole batch, 5: the streamed one (callgrind_annotate)
            runs.append(measure(args.keep / f"run-{i + 1}", args.requests))
        else:
            with tempfile.TemporaryDirectory(prefix="llmgw-server-cost-") as tmp:
                runs.append(measure(Path(tmp), args.requests))
        print(run_lines(runs)[-1], flush=True)
    print("\n".join(ratio_lines(runs)[len(runs) :]))


if __name__ == "__main__":
    main()
