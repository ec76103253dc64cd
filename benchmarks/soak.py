"""Soak: sustained load through the router for minutes, watching its memory and counting every error.

Two sim engines behind one llmgw-router process (store-backed keys, pooled limits, usage written in batches,
scraping every second) take a steady mix of streaming and non-streaming chat requests from a fixed number of
concurrent clients. The router's resident memory is sampled from /proc/PID/status every few seconds.

`rss_start_mb` is taken after a warm-up (the first tenth of the run, at least 10 s), because the first minutes
allocate caches and connection pools once; `rss_growth_ratio` is end / start. A flat router stays near 1.0;
a leak grows with the number of requests. The last line is machine-readable:

  soak: seconds=X requests=X errors=X rss_start_mb=X rss_end_mb=X rss_growth_ratio=X

Run: .venv/bin/python benchmarks/soak.py [--seconds 180] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from harness import free_port, free_ports

MODEL = "sim-soak"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def wait_http(url: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"soak: {url} did not answer 200 within {limit_s:.0f}s")


@dataclass
class Procs:
    items: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        handle = log.open("ab")
        proc = subprocess.Popen(argv, stdout=handle, stderr=handle, env=env, start_new_session=True)
        self.items.append(proc)
        return proc

    def stop(self) -> None:
        for p in self.items:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.items:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def make_key(dsn: str) -> str:
    from llmgw.adapters.keys import create_key
    from llmgw.store.store import Store

    store = await Store.open(dsn)
    try:
        return (await create_key(store, "soak", time.time(), name="soak")).plaintext
    finally:
        await store.close()


async def count_usage(dsn: str) -> int:
    from llmgw.store.store import Store

    store = await Store.open(dsn)
    try:
        return (await store.row_counts())["usage"]
    finally:
        await store.close()


def start_cluster(procs: Procs, work: Path, engines: int) -> tuple[str, int, str, str]:
    endpoints = []
    for i in range(engines):
        port, key = free_port(), f"soak-engine-key-{i}"
        argv = [
            sys.executable,
            "-m",
            "llmgw_agent.sim",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--decode-ms-per-token",
            "2",
            "--prefill-ms-per-token",
            "0.05",
            "--max-concurrency",
            "32",
        ]
        procs.start(argv, work / f"sim-{i}.log", env=dict(os.environ, VLLM_API_KEY=key))
        wait_http(f"http://127.0.0.1:{port}/health")
        endpoints.append(
            {
                "replica_id": f"soak-{i}",
                "model": MODEL,
                "engine": "sim",
                "base_url": f"http://127.0.0.1:{port}",
                "api_key": key,
                "slots": 32,
                "simulated": True,
            }
        )
    dsn = f"sqlite:///{work / 'store.db'}"
    key = asyncio.run(make_key(dsn))
    snapshot = {
        "revision": "soak",
        "models": {
            MODEL: {"context_length": 8192, "capabilities": ["chat", "completions"], "simulated": True}
        },
        "tenants": {
            "organizations": {"acme": {"limits": {"rpm": 100_000_000}}},
            "projects": {"soak": {"organization": "acme", "limits": {"rpm": 100_000_000, "tpm": 10**10}}},
        },
        "endpoints": endpoints,
    }
    (work / "snapshot.json").write_text(json.dumps(snapshot))
    port, metrics_port = free_ports(2)
    router = procs.start(
        [
            sys.executable,
            "-m",
            "llmgw_router",
            "--snapshot",
            str(work / "snapshot.json"),
            "--store",
            dsn,
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            "--log-level",
            "WARNING",
            "--router-id",
            "soak",
        ],
        work / "router.log",
    )
    wait_http(f"http://127.0.0.1:{port}/ready")
    return f"http://127.0.0.1:{port}", router.pid, key, dsn


@dataclass
class Tally:
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)


async def client(
    session: aiohttp.ClientSession, url: str, key: str, n: int, stop: float, tally: Tally
) -> None:
    i = 0
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < stop:
        i += 1
        stream = i % 3 == 0
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"client {n} request {i} " + "x" * (i % 200)}],
            "max_tokens": 8,
            "stream": stream,
        }
        try:
            async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                data = await r.read()
                tally.requests += 1
                if r.status != 200:
                    tally.errors[f"status {r.status}: {data[:120].decode(errors='replace')}"] += 1
                elif stream and b"[DONE]" not in data:
                    tally.errors["stream ended without [DONE]"] += 1
                elif not stream and b'"choices"' not in data:
                    tally.errors["answer without choices"] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.requests += 1
            tally.errors[type(exc).__name__] += 1


async def load(
    url: str, key: str, pid: int, seconds: float, concurrency: int, every: float
) -> tuple[Tally, list[tuple[float, float, int]]]:
    tally = Tally()
    samples: list[tuple[float, float, int]] = []
    start = time.monotonic()
    stop = start + seconds
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        tasks = [asyncio.create_task(client(s, url, key, n, stop, tally)) for n in range(concurrency)]
        while time.monotonic() < stop:
            samples.append((time.monotonic() - start, rss_mb(pid), tally.requests))
            await asyncio.sleep(min(every, max(0.0, stop - time.monotonic())))
        await asyncio.gather(*tasks)
        samples.append((time.monotonic() - start, rss_mb(pid), tally.requests))
    return tally, samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=180.0, help="how long to load the router (default 180)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--engines", type=int, default=2, help="sim engines behind the router (default 2)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS samples")
    ns = p.parse_args()
    procs = Procs()
    work = Path(tempfile.mkdtemp(prefix="llmgw-soak-"))
    try:
        url, pid, key, dsn = start_cluster(procs, work, ns.engines)
        tally, samples = asyncio.run(load(url, key, pid, ns.seconds, ns.concurrency, ns.sample_every))
        alive = procs.items[-1].poll() is None
        time.sleep(2.5)  # the usage writer's last batch
        written = asyncio.run(count_usage(dsn))
    finally:
        procs.stop()
    warm = max(10.0, ns.seconds / 10)
    start_sample = next((s for s in samples if s[0] >= warm), samples[0])
    print(f"{'t (s)':>8} {'rss (MB)':>9} {'requests':>9}")
    for t, rss, n in samples:
        print(f"{t:8.0f} {rss:9.1f} {n:9d}")
    errors = sum(tally.errors.values())
    for what, n in tally.errors.most_common(10):
        print(f"error x{n}: {what}")
    print(f"router alive at the end: {alive}; usage records written: {written} of {tally.requests} requests")
    rss_start, rss_end = start_sample[1], samples[-1][1]
    seconds = samples[-1][0]
    print(
        f"soak: seconds={seconds:.0f} requests={tally.requests} errors={errors} rss_start_mb={rss_start:.1f} "
        f"rss_end_mb={rss_end:.1f} rss_growth_ratio={rss_end / rss_start:.3f}"
    )


if __name__ == "__main__":
    main()
