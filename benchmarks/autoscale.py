"""Autoscaling on simulated engines: a step of demand, with the autoscaler and with the count fixed at min.

One controller (in this process), one agent process whose node has room for eight sim replicas, one router
process following the controller. Closed-loop clients send streamed chat requests: for `low` seconds as many
as one replica's capacity (the sim's max_concurrency), then for `high` seconds six times that, then `low`
seconds at one again. The same traffic runs twice: once with `scaling: {min: 1, max: 8}` (autoscaled) and once
with `{min: 1, max: 1}` (fixed at min). The ideal is ceil(demand / capacity) replicas each second.

Printed: p99 TTFT during the step for both, the share of requests refused (429/503) for both, seconds from the
step until the first new replica serves (ready in the controller, so in the routers' snapshot), and the
replica-seconds used against the ideal.

The preemption scenario: a third fleet, its Cluster declaring `classes: [critical, batch]` and the default
10 s `preemption_grace`, its node's four cores full of four `batch` replicas serving closed-loop load. A
`critical` model needing one core is committed (a file written to the repo directory the controller polls)
and, at once, one replica's capacity of clients asks for it, each retrying until answered (404 until the
router has the model, 503 while it waits to be placed or loads). Printed: seconds from the burst's first
request to the critical model's first complete answer, what was refused before and failed after, how batch
fared, and the controller's replica_yielded words (who yielded, after how much of its grace, requests cut).

The last line is machine-readable (NA for what was not run or could not run; the line before says why):

  autoscale: first_replica_s=X p99_ttft_ratio=X refused_share=X fixed_refused_share=X \
replica_seconds_over_ideal=X preempt_s=X

Run: .venv/bin/python benchmarks/autoscale.py [--quick] [--only step|preempt]
(full: 1 + 3 + 1 minutes per step run, two runs, then the preemption scenario, well under a minute;
`--low/--high/--cooldown` set the step's sizes, as tests/benchmarks/test_autoscale_smoke.py does)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from harness import free_port, free_ports, wait_http

from llmgw.adapters.keys import hash_key
from llmgw.controller.app import RunningController, start_controller
from llmgw.controller.parts.settings import ControllerOptions

KEY = "sk-llmgw-" + "b" * 43
CAPACITY = 4  # the sim's max_concurrency: sequences one replica serves at once
DECODE_MS = 20
MAX_TOKENS = 16

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: bench}
spec:
  controller: {heartbeat_interval: 500ms, unreachable_after: 10s, lost_after: 60s, resync_interval: 2s}
  router: {admission: {queue_size: 4096, timeout: 60s}}
"""
MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: sim-scale}
spec:
  context_length: 4096
  scaling: {min: 1, max: %(max)d}
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, slots: %(cap)d,
       args: {max_concurrency: %(cap)d, decode_ms_per_token: %(decode)d, prefill_ms_per_token: 0.5}}
"""


@dataclass
class Run:
    ttft_step: list[float] = field(default_factory=list)
    ok: int = 0
    refused: int = 0
    failed: int = 0
    replica_samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, replicas, ready)
    first_new_ready_s: float | None = None


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


class Fleet:
    """A controller in this process, one agent (a node of `cores` CPU cores) and one router as processes; the
    repo is a plain directory the controller polls, so writing a file there is a commit."""

    def __init__(self, work: Path, docs: dict[str, str], down_cooldown: float, cores: int = 8) -> None:
        self.work = work
        self.docs = docs
        self.down_cooldown = down_cooldown
        self.cores = cores
        self.procs: list[subprocess.Popen[bytes]] = []
        self.running: RunningController | None = None
        self.api = ""

    def commit(self, docs: dict[str, str]) -> None:
        repo = self.work / "repo"
        for name, text in docs.items():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)

    async def start(self) -> None:
        self.commit(self.docs)
        token = self.work / "token"
        token.write_text("bench-token\n")
        port = free_port()
        settings = ControllerOptions(
            repo=str(self.work / "repo"),
            store=f"sqlite:///{self.work / 'c.db'}",
            listen=f"127.0.0.1:{port}",
            metrics_listen=None,
            admin_token_file=token,
            state_dir=self.work / "state",
            dir_poll_s=0.5,
            drain_s=30.0,
            scale_down_cooldown_s=self.down_cooldown,
        )
        self.running = await start_controller(settings)
        self._agent(f"127.0.0.1:{port}", token)
        self._router(f"127.0.0.1:{port}", token)

    def _agent(self, controller: str, token: Path) -> None:
        base = self.work / "agent"
        base.mkdir()
        inv = base / "inventory.json"
        inv.write_text(json.dumps({"cpu_cores": self.cores, "memory_bytes": 32 << 30, "gpus": []}))
        lo = 24000 + (free_port() % 40) * 100
        cfg = {
            "node": "n1",
            "controllers": [controller],
            "token_file": str(token),
            "state_dir": str(base / "s"),
            "advertise_host": "127.0.0.1",
            "bind_host": "127.0.0.1",
            "port_range": [lo, lo + 99],
            "inventory_override": str(inv),
            "ready_timeout_s": 60,
            "stop_grace_s": 3,
            "max_backoff_s": 0.5,
        }
        (base / "agent.json").write_text(json.dumps(cfg))
        log = (base / "agent.log").open("ab")
        self.procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "llmgw_agent.main", "run", "--config", str(base / "agent.json")],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )

    def _router(self, controller: str, token: Path) -> None:
        keys = self.work / "keys"
        keys.write_text(f"{hash_key(KEY)} p1 key-1\n")
        port, mport = free_ports(2)
        log = (self.work / "router.log").open("ab")
        argv = [
            sys.executable,
            "-c",
            "from llmgw_router.main import main; main()",
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            f"127.0.0.1:{mport}",
            "--controller",
            controller,
            "--token-file",
            str(token),
            "--keys-file",
            str(keys),
            "--state-dir",
            str(self.work / "router-state"),  # its own usage spool, not one under the working directory
        ]
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True))
        self.api = f"http://127.0.0.1:{port}"
        wait_http(self.api + "/health", 60)

    async def admin(self, path: str) -> Any:
        assert self.running is not None
        headers = {"Authorization": f"Bearer {self.running.admin_token}"}
        async with aiohttp.ClientSession() as s, s.get(self.running.url + path, headers=headers) as r:
            return await r.json()

    async def replicas(self, model: str = "sim-scale") -> tuple[int, int]:
        items = (await self.admin("/api/v1/replicas"))["replicas"]
        mine = [x for x in items if x["model"] == model]
        return len(mine), sum(1 for x in mine if x["state"] == "ready")

    async def wait_ready(self, model: str, count: int, within: float = 90) -> None:
        deadline = time.monotonic() + within
        while (await self.replicas(model))[1] < count:  # polling the admin API: nothing to wait on here
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} replica(s) of {model} not ready within {within:.0f} s")
            await asyncio.sleep(0.3)

    async def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.running is not None:
            await self.running.stop()
        # Engines outlive their agent by design: stop every one the agent recorded.
        for record in (self.work / "agent" / "s").glob("shards/*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(record.read_text())["pgid"]), signal.SIGKILL)


async def _request(
    session: aiohttp.ClientSession, api: str, run: Run, in_step: bool, model: str = "sim-scale"
) -> int | None:
    """One streamed chat request, counted in `run`; its HTTP status (None when the connection failed)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "step"}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    started = time.monotonic()
    try:
        async with session.post(
            api + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as r:
            if r.status in (429, 503):
                run.refused += 1
                await r.read()
                await asyncio.sleep(0.2)  # a refused client backs off a little, as a real one does
                return r.status
            if r.status != 200:
                run.failed += 1
                await r.read()
                return r.status
            first = None
            async for raw in r.content:
                if first is None and raw.startswith(b"data: "):
                    first = time.monotonic() - started
            run.ok += 1
            if in_step and first is not None:
                run.ttft_step.append(first)
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        run.failed += 1
        return None


async def drive(fleet: Fleet, low: float, high: float) -> Run:
    run = Run()
    t0 = time.monotonic()
    step_at, calm_at, end_at = t0 + low, t0 + low + high, t0 + low + high + low

    def demand(now: float) -> int:
        return CAPACITY * (6 if step_at <= now < calm_at else 1)

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        while (now := time.monotonic()) < end_at:
            if i >= demand(now):
                await asyncio.sleep(0.05)
                continue
            await _request(session, fleet.api, run, step_at <= now < calm_at)

    async def sample() -> None:
        while (now := time.monotonic()) < end_at:
            total, ready = await fleet.replicas()
            run.replica_samples.append((now - t0, total, ready))
            if run.first_new_ready_s is None and now >= step_at and ready >= 2:
                run.first_new_ready_s = now - step_at
            await asyncio.sleep(0.5)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(sample(), *(client(i, session) for i in range(CAPACITY * 6)))
    return run


def replica_seconds(run: Run) -> float:
    s = run.replica_samples
    return sum((b[0] - a[0]) * a[1] for a, b in itertools.pairwise(s))


async def warm_router(fleet: Fleet, model: str) -> None:
    """The router has the endpoint once a request is answered."""
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            warm = Run()
            await _request(s, fleet.api, warm, False, model)
            if warm.ok:
                return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the router did not answer for {model} within 60 s")


async def one(work: Path, max_replicas: int, low: float, high: float, down_cooldown: float) -> Run:
    model = MODEL % {"max": max_replicas, "cap": CAPACITY, "decode": DECODE_MS}
    fleet = Fleet(work, {"cluster.yaml": CLUSTER, "models/sim.yaml": model}, down_cooldown)
    try:
        await fleet.start()
        await fleet.wait_ready("sim-scale", 1)
        await warm_router(fleet, "sim-scale")
        return await drive(fleet, low, high)
    finally:
        await fleet.stop()


PREEMPT_CLUSTER = CLUSTER + "  classes: [critical, batch]\n  preemption_grace: 10s\n"
BATCH_REPLICAS = 4  # one core each: they fill the preemption node's four cores
PREEMPT_MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: %(name)s}
spec:
  context_length: 4096
  class: %(cls)s
  scaling: {min: %(n)d, max: %(n)d}
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, slots: %(cap)d,
       args: {max_concurrency: %(cap)d, decode_ms_per_token: %(decode)d, prefill_ms_per_token: 0.5}}
"""


@dataclass
class Preempt:
    served_s: float | None = None  # from the burst's first request to the critical model's first answer
    critical: Run = field(default_factory=Run)  # the burst: refusals before it serves are expected
    refused_before: dict[str, int] = field(default_factory=dict)  # status -> count before it served
    critical_failed_after: int = 0  # any failure once it served is not
    batch: Run = field(default_factory=Run)
    preempted: list[str] = field(default_factory=list)  # the events' words
    yielded: list[str] = field(default_factory=list)
    batch_left: int = 0


def _preempt_doc(name: str, cls: str, n: int) -> str:
    return PREEMPT_MODEL % {"name": name, "cls": cls, "n": n, "cap": CAPACITY, "decode": DECODE_MS}


async def burst(fleet: Fleet, out: Preempt, after_s: float, within_s: float) -> None:
    """The critical model committed, then CAPACITY clients asking for it at once, each retrying (a little
    back-off) until it answers; they go on `after_s` past the first answer, whose failures are counted."""
    fleet.commit({"models/critical.yaml": _preempt_doc("critical", "critical", 1)})
    t0 = time.monotonic()
    give_up = t0 + within_s
    done = asyncio.Event()

    async def client(session: aiohttp.ClientSession) -> None:
        while not done.is_set() and time.monotonic() < give_up:
            served = out.served_s is not None  # when the request was sent
            status = await _request(session, fleet.api, out.critical, False, "critical")
            if status == 200 and out.served_s is None:
                out.served_s = time.monotonic() - t0
                asyncio.get_running_loop().call_later(after_s, done.set)
            elif status != 200:
                if served:
                    out.critical_failed_after += 1
                else:
                    key = str(status or "no connection")
                    out.refused_before[key] = out.refused_before.get(key, 0) + 1
                await asyncio.sleep(0.2)  # unknown model (404) until the router has it: no hot loop

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(CAPACITY)))


async def preemption(work: Path, within_s: float) -> Preempt:
    """A node of four cores full of `batch` replicas serving load; a `critical` model committed needs one
    core, so it places only if a batch replica yields (after at most the 10 s grace)."""
    docs = {
        "cluster.yaml": PREEMPT_CLUSTER,
        "models/batch.yaml": _preempt_doc("batch", "batch", BATCH_REPLICAS),
    }
    fleet = Fleet(work, docs, 60.0, cores=BATCH_REPLICAS)
    out = Preempt()
    stop = asyncio.Event()

    async def batch_client(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            if await _request(session, fleet.api, out.batch, False, "batch") not in (200, 429, 503):
                await asyncio.sleep(0.2)

    try:
        await fleet.start()
        await fleet.wait_ready("batch", BATCH_REPLICAS)
        await warm_router(fleet, "batch")
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=120), connector=aiohttp.TCPConnector(limit=0)
        ) as session:
            load = [asyncio.create_task(batch_client(session)) for _ in range(2 * BATCH_REPLICAS)]
            await asyncio.sleep(1.0)  # the batch replicas are busy when the burst comes
            await burst(fleet, out, 2.0, within_s)
            stop.set()
            await asyncio.gather(*load)
        events = (await fleet.admin("/api/v1/events?limit=1000"))["events"]
        out.preempted = [e["message"] for e in events if e["kind"] == "replica_preempted"]
        out.yielded = [e["message"] for e in events if e["kind"] == "replica_yielded"]
        out.batch_left = (await fleet.replicas("batch"))[0]
        return out
    finally:
        await fleet.stop()


def print_preemption(out: Preempt) -> None:
    rows: list[tuple[str, Any]] = [
        ("critical serves after its burst (s)", _f(out.served_s, 1)),
        ("critical refused before serving", sum(out.refused_before.values())),
        ("critical answered", out.critical.ok),
        ("critical failed after serving", out.critical_failed_after),
        ("batch answered", out.batch.ok),
        ("batch refused (429/503)", out.batch.refused),
        ("batch failed otherwise", out.batch.failed),
        (f"batch replicas (of {BATCH_REPLICAS})", out.batch_left),
        ("batch replicas preempted", len(out.preempted)),
    ]
    print(f"{'preemption':40} {'':>12}")
    for name, value in rows:
        print(f"{name:40} {value!s:>12}")
    statuses = ", ".join(f"{n} x {status}" for status, n in sorted(out.refused_before.items()))
    print(f"  refused before serving: {statuses or 'none'}")
    for words in out.yielded:
        print(f"  {words}")


def _f(value: float | None, digits: int = 3) -> str:
    return "NA" if value is None else f"{value:.{digits}f}"


def print_step(auto: Run, fixed: Run, low: float, high: float) -> str:
    """The step's table; the final line's fields for it."""
    ideal = (low + low) * 1 + high * 6
    used = replica_seconds(auto)
    rows: list[tuple[str, Any, Any]] = [
        ("p99 TTFT in the step (s)", _f(p99(auto.ttft_step)), _f(p99(fixed.ttft_step))),
        ("answered", auto.ok, fixed.ok),
        ("refused (429/503)", auto.refused, fixed.refused),
        ("failed otherwise", auto.failed, fixed.failed),
        (f"replica-seconds (ideal {ideal:.0f})", f"{used:.0f}", f"{replica_seconds(fixed):.0f}"),
    ]
    print(f"{'':32} {'autoscaled':>12} {'fixed at min':>14}")
    for name, a, f in rows:
        print(f"{name:32} {a!s:>12} {f!s:>14}")
    a99, f99 = p99(auto.ttft_step), p99(fixed.ttft_step)
    ratio = a99 / f99 if a99 is not None and f99 else None

    def share(r: Run) -> float:
        total = r.ok + r.refused + r.failed
        return (r.refused + r.failed) / total if total else 0.0

    return (
        f"first_replica_s={_f(auto.first_new_ready_s, 1)} p99_ttft_ratio={_f(ratio)} "
        f"refused_share={share(auto):.4f} fixed_refused_share={share(fixed):.4f} "
        f"replica_seconds_over_ideal={used / ideal:.3f}"
    )


STEP_NA = "first_replica_s=NA p99_ttft_ratio=NA refused_share=NA fixed_refused_share=NA replica_seconds_over_ideal=NA"


async def main_async(args: argparse.Namespace) -> None:
    low, high = (10.0, 40.0) if args.quick else (60.0, 180.0)
    low, high = args.low or low, args.high or high
    down = args.cooldown or (10.0 if args.quick else 60.0)
    base = Path(tempfile.mkdtemp(prefix="llmgw-autoscale-"))
    step_fields, preempt_s = STEP_NA, "NA"
    try:
        if args.only in (None, "step"):
            auto = await one(base / "auto", 8, low, high, down)
            fixed = await one(base / "fixed", 1, low, high, down)
            step_fields = print_step(auto, fixed, low, high)
        else:
            print("step: not run (--only preempt)")
        if args.only in (None, "preempt"):
            try:
                out = await preemption(base / "preempt", args.preempt_within)
            except RuntimeError as exc:  # the fleet did not come up: say why the figure is missing
                print(f"preempt: could not run: {exc}")
            else:
                print_preemption(out)
                if out.served_s is None:
                    print(f"preempt: the critical model did not serve within {args.preempt_within:.0f} s")
                preempt_s = _f(out.served_s, 1)
        else:
            print("preempt: not run (--only step)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"autoscale: {step_fields} preempt_s={preempt_s}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10 s + 40 s + 10 s per run (under 4 minutes)")
    parser.add_argument("--only", choices=["step", "preempt"], help="run one scenario (default: both)")
    parser.add_argument("--low", type=float, help="seconds at one replica's demand, before and after")
    parser.add_argument("--high", type=float, help="seconds at six replicas' demand")
    parser.add_argument("--cooldown", type=float, help="the controller's scale-down cool-down (s)")
    parser.add_argument(
        "--preempt-within", type=float, default=120.0, help="give the critical model this long (s)"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
