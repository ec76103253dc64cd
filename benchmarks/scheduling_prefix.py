"""The prefix workloads of benchmarks/scheduling.py: a shared-prefix workload modelled on llm-d's, and a low-reuse one.

shared-prefix  G groups of requests, each group with its own long system prompt (SYSTEM_WORDS words) and every
               request a short question of its own (QUESTION_WORDS words); groups chosen Zipf-skewed (exponent
               ZIPF_S), as llm-d's prefix-cache benchmark does. Each replica's prefix cache holds at most 25% of
               the groups' prefixes, so no replica can hold them all and where a request goes decides whether it
               is prefilled.
lowreuse       every prompt its own (LOWREUSE_WORDS random words): nothing to reuse, so a prefix policy must cost
               nothing against least-inflight.

The fleet is eight replicas with the example cluster repo's sim profile (examples/cluster-repo/models/sim.yaml:
prefill 0.2 ms/token, decode 15 ms/token, max_concurrency 8, slots 8), each publishing KV events. Load is
closed-loop at saturation: as many clients as the fleet has slots, each sending its next request when the last
one ends, for the phase's window after a warm-up (not measured); every strategy starts from empty caches.

Strategies: round-robin, least-inflight, session (the example's `session` policy: with no session header it
hashes the first two messages, the system prompt and the question), prefix (the example's `prefix` policy, its
endpoints publishing KV events: precise), prefix-approx (the same policy with no event stream: the approximate
index alone), prefix-slots (precise, its endpoints carrying the profile's slots, as deployed). Figures: p50/p90/p99 TTFT, throughput (completed requests per second of the window), and the
prefix-cache hit rate from the engines' token counters.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from scheduling import (
    MODEL,
    Procs,
    Strategy,
    _delta,
    _ms,
    _ratio,
    engine_counters,
    free_port,
    percentile,
    wait_http,
    wait_idle,
)

from llmgw.core.config.models import RoutingPolicySpec

GROUPS = 32
SYSTEM_WORDS = 2000
QUESTION_WORDS = 20
ZIPF_S = 1.0
OUT_TOKENS = 32
LOWREUSE_WORDS = 300
BLOCK = 16
REPLICAS = 8
PREFILL_MS, DECODE_MS, CONCURRENCY = 0.2, 15.0, 8  # examples/cluster-repo/models/sim.yaml's sim profile
# 25% of the groups' prefix blocks per replica ("system:" + the prompt, in blocks of 16 words)
CACHE_BLOCKS = GROUPS * ((SYSTEM_WORDS + 1) // BLOCK) // 4
WORKLOADS = ("prefix", "lowreuse")


def prefix_strategies(policies: dict[str, RoutingPolicySpec]) -> list[tuple[Strategy, bool]]:
    """(strategy, whether its endpoints name their KV-event publishers). Only prefix-slots carries slots: with
    as many clients as the fleet has slots, holding requests in the router has nothing to add, and every
    other strategy meets the same engines' queues. (Measured here, prefix-slots found fewer prefixes than
    prefix: the full filter spills a hot group's overflow at 8 in flight, the load bound only later;
    docs/routing.md.)"""
    li = RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"inflight": 1}})
    return [
        (Strategy("round-robin", RoutingPolicySpec(picker="round_robin"), False), False),
        (Strategy("least-inflight", li, False), False),
        (Strategy("session", policies["session"], False), False),
        (Strategy("prefix", policies["prefix"], False), True),
        (Strategy("prefix-approx", policies["prefix"], False), False),
        (Strategy("prefix-slots", policies["prefix"], True), True),
    ]


# ------------------------------------------------------------------------------------------------ fleet


@dataclass
class Sim:
    url: str
    events_port: int


def start_prefix_sims(procs: Procs) -> list[Sim]:
    sims = []
    for i in range(REPLICAS):
        port, events = free_port(), free_port()
        argv = [
            sys.executable, "-m", "llmgw_agent.sim", "--port", str(port), "--model", MODEL,
            "--prefill-ms-per-token", str(PREFILL_MS), "--decode-ms-per-token", str(DECODE_MS),
            "--max-concurrency", str(CONCURRENCY), "--max-tokens-default", str(OUT_TOKENS),
            "--block-size", str(BLOCK), "--prefix-cache", str(CACHE_BLOCKS), "--kv-events-port", str(events),
        ]  # fmt: skip
        proc, log = procs.start(f"prefix-sim-{i}", argv)
        sims.append((Sim(f"http://127.0.0.1:{port}", events), proc, log))
    for sim, proc, log in sims:
        wait_http(sim.url + "/health", 60, proc, log)
    return [s for s, _, _ in sims]


def _snapshot(s: Strategy, events: bool, sims: list[Sim], listen: str, metrics: str) -> dict[str, Any]:
    return {
        "revision": f"bench-prefix-{s.name}",
        "router": {
            "listen": listen,
            "metrics_listen": metrics,
            "default_policy": "p",
            "max_body_bytes": 4 * 1024 * 1024,
            "admission": {"queue_size": 4096, "timeout": "60s"},
        },
        "models": {MODEL: {"context_length": 32768, "simulated": True}},
        "policies": {"p": s.policy.model_dump(mode="json")},
        "endpoints": [
            {
                "replica_id": f"p{i}",
                "model": MODEL,
                "engine": "sim",
                "base_url": sim.url,
                "slots": CONCURRENCY if s.slots else None,
                "simulated": True,
                "kv_events": f"tcp://127.0.0.1:{sim.events_port}" if events else None,
                "kv_block_size": BLOCK,
            }
            for i, sim in enumerate(sims)
        ],
    }


def start_prefix_routers(
    procs: Procs, work: Path, strats: list[tuple[Strategy, bool]], sims: list[Sim]
) -> dict[str, str]:
    started = []
    for s, events in strats:
        listen, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        snap = work / f"snapshot-prefix-{s.name}.json"
        snap.write_text(json.dumps(_snapshot(s, events, sims, listen, metrics), indent=1))
        argv = [
            sys.executable, "-m", "llmgw_router", "--snapshot", str(snap), "--no-auth",
            "--listen", listen, "--metrics-listen", metrics, "--log-level", "WARNING",
        ]  # fmt: skip
        proc, log = procs.start(f"router-prefix-{s.name}", argv)
        started.append((s.name, f"http://{listen}", proc, log))
    for _, url, proc, log in started:
        wait_http(url + "/v1/models", 60, proc, log)
    return {name: url for name, url, _, _ in started}


# ------------------------------------------------------------------------------------------------ workload


def _words(rng: random.Random, n: int, tag: str) -> str:
    return " ".join(f"{tag}{rng.randrange(50000)}" for _ in range(n))


def system_prompts(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"group{g} " + _words(rng, SYSTEM_WORDS - 1, "s") for g in range(GROUPS)]


def zipf_weights(n: int, s: float) -> list[float]:
    return [1 / (k + 1) ** s for k in range(n)]


def next_messages(
    workload: str, rng: random.Random, systems: list[str], weights: list[float]
) -> list[dict[str, str]]:
    if workload == "lowreuse":
        return [{"role": "user", "content": _words(rng, LOWREUSE_WORDS, "u")}]
    group = rng.choices(range(GROUPS), weights=weights, k=1)[0]
    return [
        {"role": "system", "content": systems[group]},
        {"role": "user", "content": _words(rng, QUESTION_WORDS, "q")},
    ]


@dataclass
class Sample:
    ttft: float
    ok: bool


async def _one(http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> Sample:
    body = {"model": MODEL, "messages": messages, "max_tokens": OUT_TOKENS, "stream": True}
    loop = asyncio.get_running_loop()
    sent, ttft = loop.time(), math.inf
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return Sample(math.inf, False)
            async for line in resp.content:
                if line.startswith(b"data: ") and ttft == math.inf:
                    ttft = loop.time() - sent
    except (TimeoutError, aiohttp.ClientError):
        return Sample(math.inf, False)
    return Sample(ttft, True)


async def closed_loop(
    http: aiohttp.ClientSession, url: str, workload: str, seed: int, warmup_s: float, window_s: float
) -> list[Sample]:
    """REPLICAS * CONCURRENCY clients, each sending its next request when the last ended; the requests sent
    within the window after the warm-up are kept."""
    systems, weights = system_prompts(seed), zipf_weights(GROUPS, ZIPF_S)
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from, stop_at = start + warmup_s, start + warmup_s + window_s
    kept: list[Sample] = []

    async def client(i: int) -> None:
        rng = random.Random(seed * 7919 + i)
        while loop.time() < stop_at:
            sent = loop.time()
            sample = await _one(http, url, next_messages(workload, rng, systems, weights))
            if sent >= measure_from:  # in a closed loop as many end in the window as begin in it
                kept.append(sample)

    await asyncio.gather(*(client(i) for i in range(REPLICAS * CONCURRENCY)))
    return kept


@dataclass
class PrefixRow:
    strategy: str
    requests: int
    failed: int
    p50: float
    p90: float
    p99: float
    throughput: float
    hit_rate: float | None
    per_replica: list[int]


async def _reset(http: aiohttp.ClientSession, sims: list[Sim]) -> None:
    for sim in sims:
        async with http.post(sim.url + "/reset_prefix_cache") as resp:
            await resp.read()


async def _phase(
    http: aiohttp.ClientSession, sims: list[Sim], url: str, workload: str, seed: int, warmup_s: float,
    window_s: float,
) -> tuple[list[Sample], float, float, list[float]]:  # fmt: skip
    """One strategy from empty caches: its samples, cache queries and hits, and requests per replica."""
    urls = [s.url for s in sims]
    await wait_idle(http, urls, 60)
    await _reset(http, sims)
    before = await engine_counters(http, urls)
    samples = await closed_loop(http, url, workload, seed, warmup_s, window_s)
    after = await engine_counters(http, urls)
    return (
        samples,
        sum(_delta(after, before, "vllm:prefix_cache_queries_total")),
        sum(_delta(after, before, "vllm:prefix_cache_hits_total")),
        _delta(after, before, "vllm:request_success_total"),
    )


async def run_prefix(
    sims: list[Sim], routers: dict[str, str], names: list[str], workloads: tuple[str, ...], seed: int,
    warmup_s: float, window_s: float, rounds: int,
) -> dict[str, dict[str, PrefixRow]]:  # fmt: skip
    """Each workload in `rounds` rounds of window_s / rounds per strategy, the order rotated each round, so a
    background load that drifts during the run (this machine is shared) hits every strategy alike."""
    rows: dict[str, dict[str, PrefixRow]] = {}
    slice_s = window_s / rounds
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        for workload in workloads:
            got: dict[str, list[Any]] = {n: [[], 0.0, 0.0, [0.0] * REPLICAS] for n in names}
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    samples, queries, hits, per = await _phase(
                        http, sims, routers[name], workload, seed + r, warmup_s, slice_s
                    )
                    acc = got[name]
                    acc[0] += samples
                    acc[1] += queries
                    acc[2] += hits
                    acc[3] = [a + b for a, b in zip(acc[3], per, strict=True)]
            rows[workload] = {}
            for name, (samples, queries, hits, per) in got.items():
                ttfts = [s.ttft for s in samples]
                rows[workload][name] = PrefixRow(
                    name, len(samples), sum(1 for s in samples if not s.ok),
                    percentile(ttfts, 0.5), percentile(ttfts, 0.9), percentile(ttfts, 0.99),
                    sum(1 for s in samples if s.ok) / window_s, hits / queries if queries else None,
                    [int(x) for x in per],
                )  # fmt: skip
            print(prefix_table(workload, list(rows[workload].values()), seed, window_s, rounds), flush=True)
    return rows


def prefix_table(workload: str, rows: list[PrefixRow], seed: int, window_s: float, rounds: int) -> str:
    title = (
        f"\n## workload {workload}: closed loop, {REPLICAS * CONCURRENCY} clients on {REPLICAS} replicas x "
        f"{CONCURRENCY} slots, {GROUPS} groups (Zipf {ZIPF_S:g}) of {SYSTEM_WORDS}-word system prompts, "
        f"{CACHE_BLOCKS} cache blocks per replica (25% of the prefixes), {window_s:g} s in {rounds} rounds, "
        f"seed {seed}"
        if workload == "prefix"
        else f"\n## workload lowreuse: closed loop, {REPLICAS * CONCURRENCY} clients, unique "
        f"{LOWREUSE_WORDS}-word prompts, {window_s:g} s in {rounds} rounds, seed {seed}"
    )
    head = f"{'strategy':<16}{'reqs':>6}{'fail':>5}{'p50 TTFT':>10}{'p90 TTFT':>10}{'p99 TTFT':>10}{'req/s':>8}{'hit':>8}  per replica"
    lines = [title, head, "-" * len(head)]
    for r in rows:
        hit = "-" if r.hit_rate is None else f"{r.hit_rate * 100:.1f}%"
        lines.append(
            f"{r.strategy:<16}{r.requests:>6}{r.failed:>5}{_ms(r.p50):>10}{_ms(r.p90):>10}{_ms(r.p99):>10}"
            f"{r.throughput:>8.1f}{hit:>8}  {'/'.join(map(str, r.per_replica))}"
        )
    return "\n".join(lines)


def prefix_fields(rows: dict[str, dict[str, PrefixRow]]) -> str:
    """The final line's prefix figures (nan for a workload not run)."""
    nan_row = PrefixRow("-", 0, 0, math.nan, math.nan, math.nan, math.nan, None, [])
    shared, low = rows.get("prefix", {}), rows.get("lowreuse", {})
    p, rr, sess, li = (shared.get(n, nan_row) for n in ("prefix", "round-robin", "session", "least-inflight"))
    lp, lli = low.get("prefix", nan_row), low.get("least-inflight", nan_row)
    return (
        f"prefix_p90_ttft_over_rr={_ratio(p.p90, rr.p90)} "
        f"prefix_p90_ttft_over_session={_ratio(p.p90, sess.p90)} "
        f"prefix_throughput_over_least_inflight={_ratio(p.throughput, li.throughput)} "
        f"lowreuse_p99_over_least_inflight={_ratio(lp.p99, lli.p99)}"
    )


def run_prefix_workloads(
    procs: Procs, work: Path, policies: dict[str, RoutingPolicySpec], workloads: tuple[str, ...], seed: int,
    window_s: float, only: tuple[str, ...] | None,
) -> str:  # fmt: skip
    """Start the prefix fleet and its routers, run the workloads asked for, and return the final-line fields."""
    wanted = tuple(w for w in workloads if w in WORKLOADS)
    if not wanted:
        return prefix_fields({})
    strats = [(s, e) for s, e in prefix_strategies(policies) if only is None or s.name in only]
    sims = start_prefix_sims(procs)
    routers = start_prefix_routers(procs, work, strats, sims)
    # each phase starts with a cache reset, whose AllBlocksCleared is also the event stream's first batch
    rounds = max(1, round(window_s / 4))  # slices of about 4 s
    warmup = min(3.0, window_s / rounds / 2)
    names = [s.name for s, _ in strats]
    rows = asyncio.run(run_prefix(sims, routers, names, wanted, seed, warmup, window_s, rounds))
    return prefix_fields(rows)
