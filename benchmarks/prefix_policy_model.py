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
from llmgw_router.prefix import PrefixKey
from llmgw_router.scheduler import Candidate, RequestInfo, schedule
from scheduling import POLICIES_FILE, load_policies
from scheduling_prefix import (
    BLOCK,
    CACHE_BLOCKS,
    CONCURRENCY,
    DECODE_MS,
    GROUPS,
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


@dataclass
class Req:
    sent: float
    client: int
    group: int
    blocks: list[Any]
    replica: int = -1


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

    def held(self, r: int, blocks: list[Any]) -> int:
        n = 0
        for b in blocks:
            if b not in self.caches[r]:
                break
            n += 1
        return n


def run_phase(policy: RoutingPolicySpec, seed: int, warmup_s: float, window_s: float, slots: bool) -> Phase:
    rng = random.Random(seed)
    weights = [1 / (k + 1) ** ZIPF_S for k in range(GROUPS)]
    ph, events, order, ids, rr = Phase(), [], itertools.count(), itertools.count(), itertools.count()
    stop = warmup_s + window_s

    def push(t: float, kind: str, req: Req) -> None:
        heapq.heappush(events, (t, next(order), kind, req))

    def send(t: float, client: int) -> None:
        group = rng.choices(range(GROUPS), weights=weights, k=1)[0]
        blocks: list[Any] = [("g", group, i) for i in range(SHARED_BLOCKS)]
        blocks += [("q", next(ids), i) for i in range(PROMPT_BLOCKS - SHARED_BLOCKS)]
        req = Req(t, client, group, blocks)
        cands = [
            Candidate(f"r{r}", inflight=ph.inflight[r], slots=CONCURRENCY if slots else None,
                      prefix=ph.held(r, blocks) / len(blocks), prefix_source="precise")
            for r in range(REPLICAS)
        ]  # fmt: skip
        key = PrefixKey((group,), "", head=f"system: group{group}")
        decision = schedule(cands, policy, RequestInfo(prefix=key, rr_counter=next(rr)), rng)
        assert decision.endpoint is not None
        req.replica = int(decision.endpoint[1:])
        ph.inflight[req.replica] += 1
        if t >= warmup_s:
            ph.measured += 1
        if ph.running[req.replica] < CONCURRENCY:
            start(t, req)
        else:
            ph.waited += t >= warmup_s
            ph.queues[req.replica].append(req)

    def start(t: float, req: Req) -> None:
        r = req.replica
        ph.running[r] += 1
        hit = ph.held(r, req.blocks)  # looked up when the request gets its slot, as the sim does
        for b in req.blocks[:hit]:
            ph.caches[r].move_to_end(b)
        if req.sent >= warmup_s:
            ph.cached_tokens += hit * BLOCK
            ph.prompt_tokens += PROMPT_TOKENS
        push(t + (PROMPT_TOKENS - hit * BLOCK) * PREFILL_MS / 1000, "prefilled", req)

    def prefilled(t: float, req: Req) -> None:
        cache = ph.caches[req.replica]
        for b in req.blocks:
            cache[b] = None
            cache.move_to_end(b)
        while len(cache) > CACHE_BLOCKS:
            cache.popitem(last=False)
        if req.sent >= warmup_s:
            ph.ttfts.append(t + DECODE_MS / 1000 - req.sent)  # the first token follows one decode step
        push(t + OUT_TOKENS * DECODE_MS / 1000, "done", req)

    def done(t: float, req: Req) -> None:
        r = req.replica
        ph.running[r] -= 1
        ph.inflight[r] -= 1
        if req.sent >= warmup_s:
            ph.completed += 1
        if ph.queues[r]:
            start(t, ph.queues[r].pop(0))
        if t < stop:
            send(t, req.client)

    for client in range(REPLICAS * CONCURRENCY):
        send(rng.random() * 0.01, client)
    handlers = {"prefilled": prefilled, "done": done}
    while events:
        t, _, kind, req = heapq.heappop(events)
        handlers[kind](t, req)
    return ph


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def measure(
    policy: RoutingPolicySpec, seeds: int, warmup_s: float, window_s: float, slots: bool
) -> dict[str, float]:
    phases = [run_phase(policy, seed, warmup_s, window_s, slots) for seed in range(seeds)]
    ttfts = [x for p in phases for x in p.ttfts]
    return {
        "p50": percentile(ttfts, 0.5) * 1000,
        "p90": percentile(ttfts, 0.9) * 1000,
        "p99": percentile(ttfts, 0.99) * 1000,
        "rps": sum(p.completed for p in phases) / (seeds * window_s),
        "hit": sum(p.cached_tokens for p in phases) / max(1, sum(p.prompt_tokens for p in phases)),
        "waited": sum(p.waited for p in phases) / max(1, sum(p.measured for p in phases)),
    }


def strategies(load_bounds: list[float]) -> list[tuple[str, RoutingPolicySpec, bool]]:
    """(name, policy, whether the candidates carry the profile's slots, as deployed)."""
    prefix = load_policies(POLICIES_FILE)["prefix"].model_dump()
    least_inflight = RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"inflight": 1}})
    out = [
        ("round-robin", RoutingPolicySpec(picker="round_robin"), False),
        ("least-inflight", least_inflight, False),
    ]
    for bound in load_bounds:
        spec = {**prefix, "prefix": {**prefix["prefix"], "load_bound": bound}}
        policy = RoutingPolicySpec.model_validate(spec)
        out += [(f"prefix lb={bound:g}", policy, False), (f"prefix-slots lb={bound:g}", policy, True)]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load-bounds", default="1.25,1.5,2.0", help="the prefix policy's load_bound values")
    p.add_argument("--seeds", type=int, default=8, help="phases per strategy, each from empty caches")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds not measured (the benchmark's: 2)")
    p.add_argument("--window", type=float, default=4.0, help="seconds measured (the benchmark's rounds: 4)")
    ns = p.parse_args(argv)
    rows = {}
    print(
        f"{'strategy':<22}{'p50 TTFT':>10}{'p90 TTFT':>10}{'p99 TTFT':>10}{'req/s':>8}{'hit':>8}{'waited':>8}"
    )
    for name, policy, slots in strategies([float(x) for x in ns.load_bounds.split(",")]):
        rows[name] = m = measure(policy, ns.seeds, ns.warmup, ns.window, slots)
        print(
            f"{name:<22}{m['p50']:>8.0f}ms{m['p90']:>8.0f}ms{m['p99']:>8.0f}ms{m['rps']:>8.1f}{m['hit'] * 100:>7.1f}%{m['waited'] * 100:>7.1f}%",
            flush=True,
        )
    rr, li = rows["round-robin"], rows["least-inflight"]
    best = min((n for n in rows if n.startswith("prefix ")), key=lambda n: rows[n]["p90"])
    print(
        f"prefix_model: best={best.replace(' ', '_')} p90_over_rr={rows[best]['p90'] / rr['p90']:.3f} "
        f"throughput_over_least_inflight={rows[best]['rps'] / li['rps']:.3f}"
    )


if __name__ == "__main__":
    main()
