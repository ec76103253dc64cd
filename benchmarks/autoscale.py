"""Autoscaling on simulated engines: a step of demand, with the autoscaler and with the count fixed at min.

One controller (in this process), one agent process whose node has room for eight sim replicas, one router
process following the controller. Closed-loop clients send streamed chat requests: for `low` seconds as many
as one replica's capacity (the sim's max_concurrency), then for `high` seconds six times that, then `low`
seconds at one again. The same traffic runs twice: once with `scaling: {min: 1, max: 8}` (autoscaled) and once
with `{min: 1, max: 1}` (fixed at min). The ideal is ceil(demand / capacity) replicas each second.

Printed: p99 TTFT during the step for both, the share of requests refused (429/503) for both, seconds from the
step until the first new replica serves (ready in the controller, so in the routers' snapshot), and the
replica-seconds used against the ideal. The preemption scenario (a critical model's burst on a fleet full of
batch replicas) needs capacity classes, which this tree does not have: `preempt_s=NA`. The last line is
machine-readable:

  autoscale: first_replica_s=X p99_ttft_ratio=X refused_share=X fixed_refused_share=X \
replica_seconds_over_ideal=X preempt_s=NA

Run: .venv/bin/python benchmarks/autoscale.py [--quick]   (full: 1 + 3 + 1 minutes per run, two runs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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

from harness import free_port, wait_http

from llmgw.adapters.keys import hash_key
from llmgw.controller.app import RunningController, start_controller
from llmgw.controller.settings import ControllerSettings

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
    def __init__(self, work: Path, max_replicas: int, down_cooldown: float) -> None:
        self.work = work
        self.max_replicas = max_replicas
        self.down_cooldown = down_cooldown
        self.procs: list[subprocess.Popen[bytes]] = []
        self.running: RunningController | None = None
        self.api = ""

    async def start(self) -> None:
        repo = self.work / "repo"
        (repo / "models").mkdir(parents=True)
        (repo / "cluster.yaml").write_text(CLUSTER)
        (repo / "models" / "sim.yaml").write_text(
            MODEL % {"max": self.max_replicas, "cap": CAPACITY, "decode": DECODE_MS}
        )
        token = self.work / "token"
        token.write_text("bench-token\n")
        port = free_port()
        settings = ControllerSettings(
            repo=str(repo), store=f"sqlite:///{self.work / 'c.db'}", listen=f"127.0.0.1:{port}",
            metrics_listen=None, admin_token_file=token, state_dir=self.work / "state", dir_poll_s=0.5,
            drain_s=30.0, scale_down_cooldown_s=self.down_cooldown,
        )  # fmt: skip
        self.running = await start_controller(settings)
        self._agent(f"127.0.0.1:{port}", token)
        self._router(f"127.0.0.1:{port}", token)

    def _agent(self, controller: str, token: Path) -> None:
        base = self.work / "agent"
        base.mkdir()
        inv = base / "inventory.json"
        inv.write_text(json.dumps({"cpu_cores": 8, "memory_bytes": 32 << 30, "gpus": []}))
        lo = 24000 + (free_port() % 40) * 100
        cfg = {
            "node": "n1", "controllers": [controller], "token_file": str(token), "state_dir": str(base / "s"),
            "advertise_host": "127.0.0.1", "bind_host": "127.0.0.1", "port_range": [lo, lo + 99],
            "inventory_override": str(inv), "ready_timeout_s": 60, "stop_grace_s": 3, "max_backoff_s": 0.5,
        }  # fmt: skip
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
        port, mport = free_port(), free_port()
        log = (self.work / "router.log").open("ab")
        argv = [sys.executable, "-c", "from llmgw_router.main import main; main()", "--listen",
                f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{mport}", "--controller", controller,
                "--token-file", str(token), "--keys-file", str(keys)]  # fmt: skip
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True))
        self.api = f"http://127.0.0.1:{port}"
        wait_http(self.api + "/health", 60)

    async def replicas(self) -> tuple[int, int]:
        assert self.running is not None
        headers = {"Authorization": f"Bearer {self.running.admin_token}"}
        async with (
            aiohttp.ClientSession() as s,
            s.get(self.running.url + "/api/v1/replicas", headers=headers) as r,
        ):
            items = (await r.json())["replicas"]
        mine = [x for x in items if x["model"] == "sim-scale"]
        return len(mine), sum(1 for x in mine if x["state"] == "ready")

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
            try:
                import os

                os.killpg(int(json.loads(record.read_text())["pgid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass


async def _request(session: aiohttp.ClientSession, api: str, run: Run, in_step: bool) -> None:
    body = {"model": "sim-scale", "messages": [{"role": "user", "content": "step"}], "max_tokens": MAX_TOKENS,
            "stream": True}  # fmt: skip
    started = time.monotonic()
    try:
        async with session.post(api + "/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {KEY}"}) as r:  # fmt: skip
            if r.status in (429, 503):
                run.refused += 1
                await r.read()
                await asyncio.sleep(0.2)  # a refused client backs off a little, as a real one does
                return
            if r.status != 200:
                run.failed += 1
                return
            first = None
            async for raw in r.content:
                if first is None and raw.startswith(b"data: "):
                    first = time.monotonic() - started
            run.ok += 1
            if in_step and first is not None:
                run.ttft_step.append(first)
    except (aiohttp.ClientError, TimeoutError):
        run.failed += 1


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


async def one(work: Path, max_replicas: int, low: float, high: float, down_cooldown: float) -> Run:
    fleet = Fleet(work, max_replicas, down_cooldown)
    try:
        await fleet.start()

        deadline = time.monotonic() + 90
        while (await fleet.replicas())[1] < 1:  # polling the admin API: there is nothing to wait on here
            if time.monotonic() > deadline:
                raise RuntimeError("no replica of sim-scale became ready within 90 s")
            await asyncio.sleep(0.3)
        # The router has the endpoint once a request is answered.
        async with aiohttp.ClientSession() as s:
            for _ in range(300):
                warm = Run()
                await _request(s, fleet.api, warm, False)
                if warm.ok:
                    break
                await asyncio.sleep(0.2)
        return await drive(fleet, low, high)
    finally:
        await fleet.stop()


def _f(value: float | None, digits: int = 3) -> str:
    return "NA" if value is None else f"{value:.{digits}f}"


async def main_async(args: argparse.Namespace) -> None:
    low, high = (10.0, 40.0) if args.quick else (60.0, 180.0)
    down = 10.0 if args.quick else 60.0
    base = Path(tempfile.mkdtemp(prefix="llmgw-autoscale-"))
    try:
        auto = await one(base / "auto", 8, low, high, down)
        fixed = await one(base / "fixed", 1, low, high, down)
    finally:
        shutil.rmtree(base, ignore_errors=True)
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

    print(
        f"autoscale: first_replica_s={_f(auto.first_new_ready_s, 1)} p99_ttft_ratio={_f(ratio)} "
        f"refused_share={share(auto):.4f} fixed_refused_share={share(fixed):.4f} "
        f"replica_seconds_over_ideal={used / ideal:.3f} preempt_s=NA"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10 s + 40 s + 10 s per run (under 3 minutes)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
