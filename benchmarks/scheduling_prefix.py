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

Two phases per workload. First the closed loop above, for throughput. Then an open loop, for latency: Poisson
arrivals (the same times and prompts for every strategy) at --open-fraction (0.8) of the lowest closed-loop
throughput any strategy reached on that workload in this run, so every strategy runs below its own saturation
and the offered rate does not depend on the policy under test. In a saturated closed loop the response time is
clients / throughput (Little's law), so latency there measures the queue more than the policy; llm-d's
benchmark, which this workload follows, reports TTFT at fixed request rates. Each phase runs in rounds, the
strategies' order rotated each round; a row's TTFT percentiles and throughput are the median over its rounds
(one round hit by a burst of background load moves the median little), its hit rate the rounds' pooled tokens.
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
from harness import free_ports
from llmgw_agent.kv_relay import RELAY_PATH
from llmgw_agent.passthrough import fronted_argv
from scheduling import (
    MODEL,
    Procs,
    Strategy,
    _delta,
    _ms,
    _ratio,
    engine_counters,
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

    @property
    def relay(self) -> str:
        return self.url + RELAY_PATH


def start_prefix_sims(procs: Procs) -> list[Sim]:
    """Sims as an agent runs them: each publishing on 127.0.0.1 behind the pass-through, which relays the events
    (no key: the benchmark's endpoints have none, so the relay checks none)."""
    sims = []
    for i in range(REPLICAS):
        port, engine_port, events = free_ports(3)
        engine = [
            sys.executable,
            "-m",
            "llmgw_agent.sim",
            "--port",
            str(engine_port),
            "--model",
            MODEL,
            "--prefill-ms-per-token",
            str(PREFILL_MS),
            "--decode-ms-per-token",
            str(DECODE_MS),
            "--max-concurrency",
            str(CONCURRENCY),
            "--max-tokens-default",
            str(OUT_TOKENS),
            "--block-size",
            str(BLOCK),
            "--prefix-cache",
            str(CACHE_BLOCKS),
            "--kv-events-port",
            str(events),
        ]
        argv = fronted_argv(sys.executable, "127.0.0.1", port, engine_port, engine, events)
        proc, log = procs.start(f"prefix-sim-{i}", argv)
        sims.append((Sim(f"http://127.0.0.1:{port}"), proc, log))
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
                "kv_events": sim.relay if events else None,
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
        listen, metrics = (f"127.0.0.1:{port}" for port in free_ports(2))
        snap = work / f"snapshot-prefix-{s.name}.json"
        snap.write_text(json.dumps(_snapshot(s, events, sims, listen, metrics), indent=1))
        argv = [
            sys.executable,
            "-m",
            "llmgw_router",
            "--snapshot",
            str(snap),
            "--no-auth",
            "--listen",
            listen,
            "--metrics-listen",
            metrics,
            "--log-level",
            "WARNING",
        ]
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


async def _one(
    http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], sent: float | None = None
) -> Sample:
    """One streamed request; its TTFT from `sent` (the open loop's scheduled time: client lag counts), else now."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": OUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    loop = asyncio.get_running_loop()
    sent, ttft = loop.time() if sent is None else sent, math.inf
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return Sample(math.inf, False)
            async for line in resp.content:
                if line.startswith(b"data: "):
                    ttft = loop.time() - sent
                    break
            # the rest unparsed: the load generator shares the cores with the fleet it measures
            async for _ in resp.content.iter_any():
                pass
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


def open_arrivals(
    workload: str, seed: int, rate: float, span_s: float
) -> list[tuple[float, list[dict[str, str]]]]:
    """Poisson arrival times over span_s at `rate` per second, each with its prompt: the same for every
    strategy given the seed."""
    systems, weights = system_prompts(seed), zipf_weights(GROUPS, ZIPF_S)
    rng = random.Random(seed * 104729 + 1)
    out, t = [], rng.expovariate(rate)
    while t < span_s:
        out.append((t, next_messages(workload, rng, systems, weights)))
        t += rng.expovariate(rate)
    return out


async def open_loop(
    http: aiohttp.ClientSession,
    url: str,
    workload: str,
    seed: int,
    warmup_s: float,
    window_s: float,
    rate: float,
) -> list[Sample]:
    """Requests sent at their Poisson times whatever the replies do; those scheduled within the window after
    the warm-up are kept, each waited for to its end (the router's admission timeout bounds it)."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    tasks: list[asyncio.Task[Sample]] = []
    kept: list[asyncio.Task[Sample]] = []
    for at, messages in open_arrivals(workload, seed, rate, warmup_s + window_s):
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(_one(http, url, messages, sent=start + at))
        tasks.append(task)
        if at >= warmup_s:
            kept.append(task)
    await asyncio.gather(*tasks)
    return [t.result() for t in kept]


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


@dataclass
class Round:
    """One strategy's round: its samples, the engines' cache queries and hits, requests per replica."""

    samples: list[Sample]
    queries: float
    hits: float
    per_replica: list[float]
    window_s: float


def _median(values: list[float]) -> float:
    """The median of the rounds that measured anything (a round with no samples has no percentiles)."""
    ordered = sorted(v for v in values if not math.isnan(v))
    n = len(ordered)
    if n == 0:
        return math.nan
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def summarize_rounds(name: str, rounds: list[Round]) -> PrefixRow:
    """Percentiles and throughput per round, then their median; the hit rate from the pooled counters."""

    def per_round(q: float) -> float:
        return _median([percentile([s.ttft for s in r.samples], q) for r in rounds])

    queries, hits = sum(r.queries for r in rounds), sum(r.hits for r in rounds)
    per = [sum(col) for col in zip(*(r.per_replica for r in rounds), strict=True)] if rounds else []
    return PrefixRow(
        name,
        sum(len(r.samples) for r in rounds),
        sum(1 for r in rounds for s in r.samples if not s.ok),
        per_round(0.5),
        per_round(0.9),
        per_round(0.99),
        _median([sum(1 for s in r.samples if s.ok) / r.window_s for r in rounds]),
        hits / queries if queries else None,
        [int(x) for x in per],
    )


async def _reset(http: aiohttp.ClientSession, sims: list[Sim]) -> None:
    for sim in sims:
        async with http.post(sim.url + "/reset_prefix_cache") as resp:
            await resp.read()


async def _phase(
    http: aiohttp.ClientSession,
    sims: list[Sim],
    url: str,
    workload: str,
    seed: int,
    warmup_s: float,
    window_s: float,
    rate: float | None,
) -> Round:
    """One strategy's round from empty caches: closed-loop when `rate` is None, else open-loop at `rate`."""
    urls = [s.url for s in sims]
    await wait_idle(http, urls, 60)
    await _reset(http, sims)
    before = await engine_counters(http, urls)
    if rate is None:
        samples = await closed_loop(http, url, workload, seed, warmup_s, window_s)
    else:
        samples = await open_loop(http, url, workload, seed, warmup_s, window_s, rate)
    after = await engine_counters(http, urls)
    return Round(
        samples,
        sum(_delta(after, before, "vllm:prefix_cache_queries_total")),
        sum(_delta(after, before, "vllm:prefix_cache_hits_total")),
        _delta(after, before, "vllm:request_success_total"),
        window_s,
    )


@dataclass(frozen=True)
class PrefixPlan:
    seed: int
    warmup_s: float
    window_s: float
    rounds: int
    open_fraction: float


async def _rounds(
    http: aiohttp.ClientSession,
    sims: list[Sim],
    routers: dict[str, str],
    names: list[str],
    workload: str,
    plan: PrefixPlan,
    rate: float | None,
) -> dict[str, PrefixRow]:
    """`plan.rounds` rounds of window_s / rounds per strategy, the order rotated each round, so a background
    load that drifts during the run (this machine is shared) hits every strategy alike."""
    got: dict[str, list[Round]] = {n: [] for n in names}
    slice_s = plan.window_s / plan.rounds
    for r in range(plan.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name].append(
                await _phase(http, sims, routers[name], workload, plan.seed + r, plan.warmup_s, slice_s, rate)
            )
    return {name: summarize_rounds(name, rounds) for name, rounds in got.items()}


Rows = dict[str, dict[str, PrefixRow]]  # phase ("prefix", "prefix-open", ...) -> strategy -> row


async def run_prefix(
    sims: list[Sim], routers: dict[str, str], names: list[str], workloads: tuple[str, ...], plan: PrefixPlan
) -> Rows:
    """Each workload closed-loop, then open-loop at plan.open_fraction of the lowest closed-loop throughput."""
    rows: Rows = {}
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        for workload in workloads:
            closed = rows[workload] = await _rounds(http, sims, routers, names, workload, plan, None)
            print(prefix_table(workload, list(closed.values()), plan), flush=True)
            lowest = min(closed.values(), key=lambda row: row.throughput)
            rate = plan.open_fraction * lowest.throughput
            if not rate > 0:
                print(f"\n## workload {workload}: no open loop (no strategy completed a request)", flush=True)
                continue
            opened = rows[f"{workload}-open"] = await _rounds(
                http, sims, routers, names, workload, plan, rate
            )
            title = (
                f"\n## workload {workload}: open loop, Poisson arrivals at {rate:.1f} req/s "
                f"({plan.open_fraction:g} of the lowest closed-loop throughput, {lowest.strategy}'s "
                f"{lowest.throughput:.1f}), {plan.window_s:g} s in {plan.rounds} rounds, seed {plan.seed}"
            )
            print(prefix_table(workload, list(opened.values()), plan, title), flush=True)
    return rows


def prefix_table(workload: str, rows: list[PrefixRow], plan: PrefixPlan, title: str = "") -> str:
    seed, window_s, rounds = plan.seed, plan.window_s, plan.rounds
    title = title or (
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


def prefix_fields(rows: Rows) -> str:
    """The final line's prefix figures (nan for a workload not run): latency from the open loop, throughput
    from the closed loop, and the closed loop's latency ratios too, under `_closed` names."""
    nan_row = PrefixRow("-", 0, 0, math.nan, math.nan, math.nan, math.nan, None, [])

    def pick(phase: str, name: str) -> PrefixRow:
        return rows.get(phase, {}).get(name, nan_row)

    def ratios(suffix: str) -> tuple[str, str, str]:
        shared, low = "prefix" + suffix, "lowreuse" + suffix
        p, rr, sess = (pick(shared, n) for n in ("prefix", "round-robin", "session"))
        return (
            _ratio(p.p90, rr.p90),
            _ratio(p.p90, sess.p90),
            _ratio(pick(low, "prefix").p99, pick(low, "least-inflight").p99),
        )

    over_rr, over_session, low_p99 = ratios("-open")
    over_rr_closed, over_session_closed, low_p99_closed = ratios("")
    throughput = _ratio(pick("prefix", "prefix").throughput, pick("prefix", "least-inflight").throughput)
    return (
        f"prefix_p90_ttft_over_rr={over_rr} prefix_p90_ttft_over_session={over_session} "
        f"prefix_throughput_over_least_inflight={throughput} lowreuse_p99_over_least_inflight={low_p99} "
        f"prefix_p90_ttft_over_rr_closed={over_rr_closed} "
        f"prefix_p90_ttft_over_session_closed={over_session_closed} "
        f"lowreuse_p99_over_least_inflight_closed={low_p99_closed}"
    )


def run_prefix_workloads(
    procs: Procs,
    work: Path,
    policies: dict[str, RoutingPolicySpec],
    workloads: tuple[str, ...],
    seed: int,
    window_s: float,
    only: tuple[str, ...] | None,
    open_fraction: float = 0.8,
) -> str:
    """Start the prefix fleet and its routers, run the workloads asked for, and return the final-line fields."""
    wanted = tuple(w for w in workloads if w in WORKLOADS)
    if not wanted:
        return prefix_fields({})
    strats = [(s, e) for s, e in prefix_strategies(policies) if only is None or s.name in only]
    sims = start_prefix_sims(procs)
    routers = start_prefix_routers(procs, work, strats, sims)
    # each phase starts with a cache reset, whose AllBlocksCleared is also the event stream's first batch
    rounds = max(1, round(window_s / 4))  # slices of about 4 s
    plan = PrefixPlan(seed, min(3.0, window_s / rounds / 2), window_s, rounds, open_fraction)
    names = [s.name for s, _ in strats]
    rows = asyncio.run(run_prefix(sims, routers, names, wanted, plan))
    return prefix_fields(rows)
