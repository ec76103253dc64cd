"""What the agent's key-checking pass-through costs per streamed token: the sim engine direct vs through it.

One run, one sim engine (decode time 0, so the engine is as fast as it can stream and any overhead shows),
one pass-through in its own process (as in the agent: engine on 127.0.0.1, the pass-through on another port
checking the key on every request). The same streaming load is sent both ways, alternating rounds so a noisy
machine hurts both alike. Prints a table and a machine-readable last line:

  passthrough_overhead: tokens_per_s_direct=X tokens_per_s_through=X ratio=X added_us_per_token=X
  cpu_us_per_token=X

`ratio` is through / direct throughput (1.0 = free); `added_us_per_token` is the added time between two tokens
of one stream at that concurrency; `cpu_us_per_token` is the pass-through process's own CPU time (user+system,
from /proc) per token it relayed, the cost that does not depend on how busy the machine is. Run: .venv/bin/python benchmarks/passthrough_overhead.py
[--concurrency 8] [--tokens 256] [--rounds 3] [--requests 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from harness import free_ports

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-engine-key"
MODEL = "bench-model"

PASSTHROUGH = r"""
import asyncio, sys
from llmgw_agent.passthrough import PassThrough, key_digest
async def main():
    p = PassThrough("127.0.0.1", int(sys.argv[1]), int(sys.argv[2]), key_digest(sys.argv[3]))
    await p.start()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "agent"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "VLLM_API_KEY": KEY}


async def wait_up(url: str, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url, headers={"Authorization": f"Bearer {KEY}"}) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not come up in {limit_s:g}s")
            await asyncio.sleep(0.05)


async def one_stream(http: aiohttp.ClientSession, base: str, tokens: int) -> int:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "ignore_eos": True,  # the sim runs to max_tokens, not its own end
        "stream": True,
    }
    count = 0
    async with http.post(
        f"{base}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
    ) as resp:
        assert resp.status == 200, resp.status
        async for line in resp.content:
            if line.startswith(b"data: {"):
                count += 1
    return count


async def load(base: str, concurrency: int, requests: int, tokens: int) -> tuple[int, float]:
    """Streamed chunks received and seconds taken for `requests` streams, `concurrency` at a time."""
    sem = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def bounded() -> int:
            async with sem:
                return await one_stream(http, base, tokens)

        started = time.perf_counter()
        counts = await asyncio.gather(*(bounded() for _ in range(requests)))
        return sum(counts), time.perf_counter() - started


def main(ns: argparse.Namespace) -> None:
    engine_port, through_port = free_ports(2)
    sim = [sys.executable, "-m", "llmgw_agent.sim", "--host", "127.0.0.1", "--port", str(engine_port)]
    sim += ["--model", MODEL, "--decode-ms-per-token", "0", "--prefill-ms-per-token", "0"]
    sim += ["--max-concurrency", str(ns.concurrency), "--max-tokens-default", str(ns.tokens)]
    procs = [
        subprocess.Popen(sim, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen(
            [sys.executable, "-c", PASSTHROUGH, str(through_port), str(engine_port), KEY],
            env=env(),
            stdout=subprocess.DEVNULL,
        ),
    ]
    try:
        asyncio.run(measure(ns, engine_port, through_port, procs[1].pid))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


async def measure(ns: argparse.Namespace, engine_port: int, through_port: int, through_pid: int) -> None:
    direct, through = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{through_port}"
    await wait_up(f"{direct}/health")
    await wait_up(f"{through}/health")
    await load(direct, ns.concurrency, ns.concurrency, ns.tokens)  # warm both paths
    await load(through, ns.concurrency, ns.concurrency, ns.tokens)
    totals = {"direct": [0, 0.0], "through": [0, 0.0]}
    cpu = 0.0
    for _ in range(ns.rounds):
        for name, base in (("direct", direct), ("through", through)):
            before = cpu_seconds(through_pid)
            chunks, secs = await load(base, ns.concurrency, ns.requests, ns.tokens)
            if name == "through":
                cpu += cpu_seconds(through_pid) - before
            totals[name][0] += chunks
            totals[name][1] += secs
    rate = {name: chunks / secs for name, (chunks, secs) in totals.items()}
    added_us = (1 / rate["through"] - 1 / rate["direct"]) * 1e6 * ns.concurrency
    print(f"{'path':<8} {'tokens':>9} {'seconds':>8} {'tokens/s':>10}")
    for name, (chunks, secs) in totals.items():
        print(f"{name:<8} {int(chunks):>9} {secs:>8.2f} {rate[name]:>10.0f}")
    print(
        f"passthrough_overhead: tokens_per_s_direct={rate['direct']:.0f} "
        f"tokens_per_s_through={rate['through']:.0f} ratio={rate['through'] / rate['direct']:.3f} "
        f"added_us_per_token={added_us:.1f} cpu_us_per_token={cpu / totals['through'][0] * 1e6:.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    parser.add_argument("--requests", type=int, default=16, help="streams per round and path")
    parser.add_argument("--rounds", type=int, default=3)
    main(parser.parse_args())
