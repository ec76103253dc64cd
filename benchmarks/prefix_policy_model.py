"""A discrete-event model of the shared-prefix workload, driving the router's own `schedule()`: policy choices
compared without the CPU of a shared machine in the way.

benchmarks/scheduling_prefix.py runs the real fleet (eight sims, routers, 64 clients) and on a 2-core machine
shared with other work its figures move by 20-30 % run to run, and the sims and routers compete with each
other for the CPU. This model keeps what decides the policy's figures and drops the rest: the same workload
(GROUPS Zipf-skewed groups, each a SYSTEM_WORDS-word system prompt and a question of its own; 64 closed-loop
clients; eight replicas of eight FIFO slots, each with an LRU prefix cache of CACHE_BLOCKS blocks; prefill
PREFILL_MS per uncached token, decode DECODE_MS per token, OUT_TOKENS out), each phase from empty caches with
the same warm-up and window as the benchmark's rounds, and the candidates scored by `schedule()` with each
replica's cache as its precise index (the events arrive as the blocks are stored, after the prefill). Not
modelled: the router's and engines' CPU, the network, the event latency beyond the prefill.

Two phases per strategy, as the benchmark has: the closed loop at saturation (throughput), then an open loop of
Poisson arrivals at --open-fraction (0.8) of the lowest closed-loop throughput any strategy reached (latency:
every strategy below its own saturation, the offered rate the same for all). In a saturated closed loop the
response time is clients / throughput (Little's law), so latency there measures the queue more than the policy.
`--workload lowreuse` models the low-reuse workload (every prompt its own LOWREUSE_WORDS words).

    .venv/bin/python benchmarks/prefix_policy_model.py --load-bounds 1.25,1.5,2.0 --seeds 12
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llmgw_router.decisions.prefix import PrefixKey
from llmgw_router.decisions.scheduler import Candidate, RequestInfo, schedule
from scheduling import POLICIES_FILE, load_policies
from scheduling_prefix import (
    BLOCK,
    CACHE_BLOCKS,
    CONCURRENCY,
    DECODE_MS,
    GROUPS,
    LOWREUSE_WORDS,
    OUT_TOKENS,
    PREFILL_MS,
    QUESTION_WORDS,
    REPLICAS,
    SYSTEM_WORDS,
    ZIPF_S,
)

from llmgw.core.config.models import RoutingPolicySpec

# "system:" + the system prompt's words, "user:" + the question's: the sim's tokens
PROMPT_TOKENS = 1 + SYSTEM_WORDS + 1 + QUESTION_WORDS
SHARED_BLOCKS = (1 + SYSTEM_WORDS) // BLOCK  # full blocks of the system prompt alone
PROMPT_BLOCKS = PROMPT_TOKENS // BLOCK
LOWREUSE_TOKENS = 1 + LOWREUSE_WORDS  # "user:" + the words


@dataclass
class Req:
    sent: float
    client: int
    group: int
    blocks: list[Any]
    tokens: int
    serial: int = 0
    replica: int = -1
    waited: bool = False  # found its replica's slots taken and queued there
    hit_blocks: int = 0


@dataclass
class Phase:
    """One phase's state: the replicas' caches, slots and queues, and what was measured."""

    caches: list[OrderedDict[Any, None]] = field(
        default_factory=lambda: [OrderedDict() for _ in range(REPLICAS)]
    )
    inflight: list[int] = field(default_factory=lambda: [0] * REPLICAS)
    running: list[int] = field(default_factory=lambda: [0] * REPLICAS)
    queues: list[list[Req]] = field(default_factory=lambda: [[] for _ in range(REPLICAS)])
    ttfts: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    prompt_tokens: int = 0
    completed: int = 0
    waited: int = 0  # measured requests that found their replica's slots taken and queued
    measured: int = 0
    # per measured request: (TTFT, waited for a slot, share of its prompt found cached)
    outcomes: list[tuple[float, bool, float]] = field(default_factory=list)

    def held(self, r: int, blocks: list[Any]) -> int:
        n = 0
        for b in blocks:
            if b not in self.caches[r]:
                break
            n += 1
        return n

    def lookup(self, r: int, blocks: list[Any]) -> int:
        """The leading blocks replica r holds, refreshed in its LRU."""
        hit = self.held(r, blocks)
        for b in blocks[:hit]:
            self.caches[r].move_to_end(b)
        return hit

    def store(self, r: int, blocks: list[Any]) -> None:
        """A prefill's blocks into replica r's LRU, the oldest evicted past CACHE_BLOCKS."""
        cache = self.caches[r]
        for b in blocks:
            cache[b] = None
            cache.move_to_end(b)
        while len(cache) > CACHE_BLOCKS:
            cache.popitem(last=False)

    def candidates(self, blocks: list[Any], slots: bool) -> list[Candidate]:
        """What the router would see: each replica's in-flight count and, from its cache, its precise match."""
        return [
            Candidate(
                f"r{r}",
                inflight=self.inflight[r],
                slots=CONCURRENCY if slots else None,
                prefix=self.held(r, blocks) / len(blocks),
                prefix_source="precise",
            )
            for r in range(REPLICAS)
        ]


def make_request(
    workload: str, rng: random.Random, weights: list[float], n: int, t: float, client: int
) -> tuple[Req, PrefixKey]:
    """Request n of the workload: a group's system prompt (Zipf-drawn) and a question of its own, or (lowreuse)
    a prompt of its own; with the PrefixKey the router would build."""
    if workload == "lowreuse":
        blocks: list[Any] = [("u", n, i) for i in range(LOWREUSE_TOKENS // BLOCK)]
        return Req(t, client, -1, blocks, LOWREUSE_TOKENS, n), PrefixKey((n,), "", head=f"u{n}")
    group = rng.choices(range(GROUPS), weights=weights, k=1)[0]
    blocks = [("g", group, i) for i in range(SHARED_BLOCKS)]
    blocks += [("q", n, i) for i in range(PROMPT_BLOCKS - SHARED_BLOCKS)]
    head = f"system: group{group}"
    return Req(t, client, group, blocks, PROMPT_TOKENS, n), PrefixKey((group,), "", head=head)


@dataclass(frozen=True)
class Load:
    """How requests arrive: `rate` None is the closed loop (REPLICAS * CONCURRENCY clients, each sending its
    next request when the last ends); else Poisson arrivals at `rate` per second."""

    workload: str = "prefix"
    rate: float | None = None
    session: bool = False  # the request carries a session key, as the session policy's hashing of the head


def run_phase(
    policy: RoutingPolicySpec, seed: int, warmup_s: float, window_s: float, slots: bool, load: Load = Load()
) -> Phase:
    # the workload's draws (arrivals, groups) apart from the scheduler's tie-breaks: the same requests at the
    # same times for every strategy, whatever its picker consumes
    rng, pick_rng = random.Random(seed), random.Random(seed + 1_000_003)
    weights = [1 / (k + 1) ** ZIPF_S for k in range(GROUPS)]
    ph, events, order, ids, rr = Phase(), [], itertools.count(), itertools.count(), itertools.count()
    stop = warmup_s + window_s

    def push(t: float, kind: str, req: Req) -> None:
        heapq.heappush(events, (t, next(order), kind, req))

    def send(t: float, client: int) -> None:
        req, key = make_request(load.workload, rng, weights, next(ids), t, client)
        cands = ph.candidates(req.blocks, slots)
        # the session policy with no session header hashes the first two messages: a key per request
        info = RequestInfo(
            session_key=f"s{req.serial}" if load.session else None, prefix=key, rr_counter=next(rr)
        )
        decision = schedule(cands, policy, info, pick_rng)
        assert decision.endpoint is not None
        req.replica = int(decision.endpoint[1:])
        ph.inflight[req.replica] += 1
        if t >= warmup_s:
            ph.measured += 1
        if ph.running[req.replica] < CONCURRENCY:
            start(t, req)
        else:
            req.waited = True
            ph.waited += t >= warmup_s
            ph.queues[req.replica].append(req)

    def start(t: float, req: Req) -> None:
        r = req.replica
        ph.running[r] += 1
        hit = req.hit_blocks = ph.lookup(r, req.blocks)  # when the request gets its slot, as the sim does
        if req.sent >= warmup_s:
            ph.cached_tokens += hit * BLOCK
            ph.prompt_tokens += req.tokens
        push(t + (req.tokens - hit * BLOCK) * PREFILL_MS / 1000, "prefilled", req)

    def prefilled(t: float, req: Req) -> None:
        ph.store(req.replica, req.blocks)
        if req.sent >= warmup_s:
            ttft = t + DECODE_MS / 1000 - req.sent  # the first token follows one decode step
            ph.ttfts.append(ttft)
            ph.outcomes.append((ttft, req.waited, req.hit_blocks / len(req.blocks)))
        push(t + OUT_TOKENS * DECODE_MS / 1000, "done", req)

    def done(t: float, req: Req) -> None:
        r = req.replica
        ph.running[r] -= 1
        ph.inflight[r] -= 1
        if req.sent >= warmup_s:
            ph.completed += 1
        if ph.queues[r]:
            start(t, ph.queues[r].pop(0))
        if load.rate is None and t < stop:
            send(t, req.client)

    def arrive(t: float, req: Req) -> None:
        send(t, -1)
        assert load.rate is not None
        if (nxt := t + rng.expovariate(load.rate)) < stop:
            push(nxt, "arrive", req)

    if load.rate is None:
        for client in range(REPLICAS * CONCURRENCY):
            send(rng.random() * 0.01, client)
    else:
        push(rng.expovariate(load.rate), "arrive", Req(0.0, -1, -1, [], 0))
    handlers = {"prefilled": prefilled, "done": done, "arrive": arrive}
    while events:
        t, _, kind, req = heapq.heappop(events)
        handlers[kind](t, req)
    return ph


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def measure(
    policy: RoutingPolicySpec, seeds: int, warmup_s: float, window_s: float, slots: bool, load: Load
) -> dict[str, float]:
    phases = [run_phase(policy, seed, warmup_s, window_s, slots, load) for seed in range(seeds)]
    ttfts = [x for p in phases for x in p.ttfts]
    outcomes = [o for p in phases for o in p.outcomes]
    return {
        "p50": percentile(ttfts, 0.5) * 1000,
        "p90": percentile(ttfts, 0.9) * 1000,
        "p99": percentile(ttfts, 0.99) * 1000,
        "rps": sum(p.completed for p in phases) / (seeds * window_s),
        "hit": sum(p.cached_tokens for p in phases) / max(1, sum(p.prompt_tokens for p in phases)),
        "waited": sum(p.waited for p in phases) / max(1, sum(p.measured for p in phases)),
        # what the p90 is made of: above 10% missed (or missed plus waited), the p90 request is one of them
        "missed": sum(1 for o in outcomes if o[2] < 0.5) / max(1, len(outcomes)),
        "hit_waited": sum(1 for o in outcomes if o[1] and o[2] >= 0.5) / max(1, len(outcomes)),
    }


Strat = tuple[str, RoutingPolicySpec, bool, bool]  # name, policy, slots known, session key sent


def strategies(load_bounds: list[float]) -> list[Strat]:
    """(name, policy, whether the candidates carry the profile's slots, as deployed, whether the request
    carries a session key: the session policy's)."""
    policies = load_policies(POLICIES_FILE)
    prefix = policies["prefix"].model_dump()
    least_inflight = RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"inflight": 1}})
    out: list[Strat] = [
        ("round-robin", RoutingPolicySpec(picker="round_robin"), False, False),
        ("least-inflight", least_inflight, False, False),
        ("session", policies["session"], False, True),
    ]
    for bound in load_bounds:
        spec = {**prefix, "prefix": {**prefix["prefix"], "load_bound": bound}}
        policy = RoutingPolicySpec.model_validate(spec)
        out += [
            (f"prefix lb={bound:g}", policy, False, False),
            (f"prefix-slots lb={bound:g}", policy, True, False),
        ]
    return out


HEAD = (
    f"{'strategy':<22}{'p50 TTFT':>10}{'p90 TTFT':>10}{'p99 TTFT':>10}{'req/s':>8}{'hit':>8}{'waited':>8}"
    f"{'missed':>8}{'hit+wait':>10}"
)


def _row(name: str, m: dict[str, float]) -> str:
    return (
        f"{name:<22}{m['p50']:>8.0f}ms{m['p90']:>8.0f}ms{m['p99']:>8.0f}ms{m['rps']:>8.1f}{m['hit'] * 100:>7.1f}%"
        f"{m['waited'] * 100:>7.1f}%{m['missed'] * 100:>7.1f}%{m['hit_waited'] * 100:>9.1f}%"
    )


def run_workload(workload: str, strats: list[Strat], ns: argparse.Namespace) -> tuple[dict[str, Any], ...]:
    """The closed loop for every strategy, then the open loop at a fraction of the lowest throughput."""
    closed: dict[str, dict[str, float]] = {}
    print(f"\n## {workload}: closed loop, {REPLICAS * CONCURRENCY} clients, {ns.seeds} phases per row")
    print(HEAD)
    for name, policy, slots, session in strats:
        closed[name] = measure(policy, ns.seeds, ns.warmup, ns.window, slots, Load(workload, None, session))
        print(_row(name, closed[name]), flush=True)
    lowest = min(closed, key=lambda n: closed[n]["rps"])
    rate = ns.open_fraction * closed[lowest]["rps"]
    print(
        f"\n## {workload}: open loop, Poisson arrivals at {rate:.1f} req/s ({ns.open_fraction:g} of the lowest "
        f"closed-loop throughput, {lowest}'s {closed[lowest]['rps']:.1f})"
    )
    print(HEAD)
    opened: dict[str, dict[str, float]] = {}
    for name, policy, slots, session in strats:
        opened[name] = measure(policy, ns.seeds, ns.warmup, ns.window, slots, Load(workload, rate, session))
        print(_row(name, opened[name]), flush=True)
    return closed, opened


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load-bounds", default="1.25,1.5,2.0", help="the prefix policy's load_bound values")
    p.add_argument("--seeds", type=int, default=8, help="phases per strategy, each from empty caches")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds not measured (the benchmark's: 2)")
    p.add_argument("--window", type=float, default=4.0, help="seconds measured (the benchmark's rounds: 4)")
    p.add_argument(
        "--open-fraction",
        type=float,
        default=0.8,
        help="the open loop's rate, as a fraction of the lowest closed-loop throughput",
    )
    p.add_argument("--workloads", default="prefix", help="comma-separated: prefix,lowreuse")
    ns = p.parse_args(argv)
    bounds = [float(x) for x in ns.load_bounds.split(",")]
    strats = strategies(bounds)
    # the summary is the shipped load bound's when it was run (ties among bounds are common), else the first's
    shipped = load_policies(POLICIES_FILE)["prefix"].prefix.load_bound
    best = f"prefix lb={shipped if shipped in bounds else bounds[0]:g}"
    for workload in ns.workloads.split(","):
        closed, opened = run_workload(workload, strats, ns)
        if workload == "lowreuse":
            print(
                f"lowreuse_model: policy={best.replace(' ', '_')} "
                f"p99_over_least_inflight={opened[best]['p99'] / opened['least-inflight']['p99']:.3f} "
                f"p99_over_least_inflight_closed={closed[best]['p99'] / closed['least-inflight']['p99']:.3f}"
            )
            continue
        o, c = opened, closed
        print(
            f"prefix_model: policy={best.replace(' ', '_')} p90_over_rr={o[best]['p90'] / o['round-robin']['p90']:.3f} "
            f"p90_over_session={o[best]['p90'] / o['session']['p90']:.3f} "
            f"throughput_over_least_inflight={c[best]['rps'] / c['least-inflight']['rps']:.3f} "
            f"p90_over_rr_closed={c[best]['p90'] / c['round-robin']['p90']:.3f} "
            f"p90_over_session_closed={c[best]['p90'] / c['session']['p90']:.3f}"
        )


if __name__ == "__main__":
    main()
