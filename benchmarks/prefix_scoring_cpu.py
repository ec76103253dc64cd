"""The prefix policy's CPU per request on the low-reuse workload, against least-inflight's: the router's own
request-path code, in one process, no network.

On low reuse (every prompt its own LOWREUSE_WORDS words; benchmarks/scheduling_prefix.py) the prefix policy picks
as least-inflight does (tests/router/test_prefix_spill.py), so whatever separates their latencies there is CPU
per request or noise. Per request, each path does what the router does for it:

  least-inflight  candidates from eight endpoints, schedule()
  prefix          PrefixRouting.key (the prompt rendered, its approximate hashes), candidates, annotate (one
                  block's engine hash, looked up per endpoint), schedule(), placed (the approximate record,
                  the event expectation), and the KV-event batch the request's prefill brings back from the
                  engine: msgpack-decoded, parsed and applied to the precise index, as kv_events.py does. The
                  batch is the sim's (llmgw_agent.sim_events.batch_events): the request's BlockStored with its
                  token ids, and a BlockRemoved of as many older blocks (a full cache evicts as it stores).

Prints microseconds per request for both paths and the prefix path's parts, then one machine-readable line:

  prefix_scoring_cpu: least_inflight_us=X prefix_us=X prefix_over_least_inflight=X events_us=X
  prefix_core_share_at_100rps=X

(the last: the share of one core the prefix path's extra work takes at 100 requests per second, the low-reuse
rate on the benchmark's fleet). Timings are the best of --repeats runs of --requests requests each (the least
disturbed by other work on a shared machine); the ratio, not the absolute figure, is the result.

    .venv/bin/python benchmarks/prefix_scoring_cpu.py [--requests 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llmgw_agent.sim_events import batch_events
from llmgw_agent.sim_model import CacheChange
from llmgw_router.decisions.prefix import parse_event_batch, sim_chat_text, sim_token_ids, vllm_chain
from llmgw_router.decisions.scheduler import RequestInfo, schedule
from llmgw_router.fleet.table import LiveEndpoint
from llmgw_router.routing.prefix_routing import PrefixRouting
from scheduling import MODEL, POLICIES_FILE, load_policies
from scheduling_prefix import BLOCK, LOWREUSE_WORDS, REPLICAS, _words

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.snapshot import Endpoint

STALE_AFTER = 10.0


def endpoints(events: bool) -> list[LiveEndpoint]:
    return [
        LiveEndpoint(
            Endpoint(
                replica_id=f"p{i}",
                model=MODEL,
                engine="sim",
                base_url=f"http://127.0.0.1:{9000 + i}",
                simulated=True,
                kv_events=f"http://127.0.0.1:{9000 + i}/llmgw/kv-events" if events else None,
                kv_block_size=BLOCK,
            ),
            f"http://127.0.0.1:{9000 + i}/v1",
            None,
            None,
            0.0,
        )
        for i in range(REPLICAS)
    ]


def bodies(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"model": MODEL, "messages": [{"role": "user", "content": _words(rng, LOWREUSE_WORDS, "u")}]}
        for _ in range(n)
    ]


def event_payloads(requests: list[dict[str, Any]], seed: str) -> list[bytes]:
    """Per request, the batch its prefill publishes: its blocks stored, and the previous request's evicted."""
    out, previous = [], []
    for body in requests:
        ids = sim_token_ids(sim_chat_text(body["messages"]))
        chain = vllm_chain(ids, BLOCK, bytes(32), None, 0, 1 << 30)  # the digests' values do not matter here
        stored = [
            (h, chain[i - 1][0] if i else None, ids[i * BLOCK : (i + 1) * BLOCK])
            for i, (h, _) in enumerate(chain)
        ]
        change = CacheChange(stored=stored, removed=previous)
        out.append(msgpack.packb([time.time(), batch_events(change, BLOCK)]))
        previous = [h for h, _, _ in stored]
    return out


def least_inflight_path(policy: RoutingPolicySpec) -> Callable[[int, dict[str, Any], bytes], None]:
    eps, rng = endpoints(False), random.Random(1)

    def one(i: int, body: dict[str, Any], payload: bytes) -> None:
        cands = [ep.candidate(0.0, STALE_AFTER) for ep in eps]
        schedule(cands, policy, RequestInfo(rr_counter=i), rng)

    return one


def prefix_path(
    policy: RoutingPolicySpec, parts: dict[str, float] | None = None
) -> Callable[[int, dict[str, Any], bytes], None]:
    eps, rng, pr = endpoints(True), random.Random(1), PrefixRouting()
    for ep in eps:
        pr.events.apply(ep.id, [], 0.0)  # each stream heard: the precise index answers, as in the benchmark
    clock, spent = time.perf_counter, parts if parts is not None else {}

    def one(i: int, body: dict[str, Any], payload: bytes) -> None:
        t0 = clock()
        key = pr.key(body, policy, "")
        assert key is not None
        tk = clock()
        cands = [ep.candidate(0.0, STALE_AFTER) for ep in eps]
        t1 = clock()
        pr.annotate(cands, eps, key, policy, "", 0.0)
        t2 = clock()
        decision = schedule(cands, policy, RequestInfo(rr_counter=i, prefix=key), rng)
        t3 = clock()
        ep = eps[int(str(decision.endpoint)[1:])]
        pr.placed(ep, key, policy, "", 0.0)
        t4 = clock()
        raw = msgpack.unpackb(payload, raw=False)
        t5 = clock()
        _, events = parse_event_batch(raw)
        pr.events.apply(ep.id, events, 0.0)
        t6 = clock()
        if parts is not None:
            for name, dt in (
                ("key", tk - t0),
                ("candidates", t1 - tk),
                ("annotate", t2 - t1),
                ("schedule", t3 - t2),
                ("placed", t4 - t3),
                ("events_decode", t5 - t4),
                ("events_apply", t6 - t5),
            ):
                spent[name] = spent.get(name, 0.0) + dt

    return one


def best_us(
    make: Callable[[], Callable[[int, dict[str, Any], bytes], None]],
    requests: list[dict[str, Any]],
    payloads: list[bytes],
    repeats: int,
) -> float:
    """The best of `repeats` runs, each on a fresh path (empty indexes), in microseconds per request."""
    best = float("inf")
    for _ in range(repeats):
        one = make()
        started = time.process_time()
        for i, (body, payload) in enumerate(zip(requests, payloads, strict=True)):
            one(i, body, payload)
        best = min(best, (time.process_time() - started) / len(requests))
    return best * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=42)
    ns = p.parse_args(argv)
    policies = load_policies(POLICIES_FILE)
    prefix = policies["prefix"]
    least = RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"inflight": 1}})
    requests = bodies(ns.requests, ns.seed)
    payloads = event_payloads(requests, prefix.prefix.hash_seed)
    li_us = best_us(lambda: least_inflight_path(least), requests, payloads, ns.repeats)
    px_us = best_us(lambda: prefix_path(prefix), requests, payloads, ns.repeats)
    parts: dict[str, float] = {}
    prefix_path(prefix, parts)  # warm nothing: a separate instrumented run, for the breakdown only
    one = prefix_path(prefix, parts)
    for i, (body, payload) in enumerate(zip(requests, payloads, strict=True)):
        one(i, body, payload)
    print(
        f"low-reuse requests ({LOWREUSE_WORDS} words), {REPLICAS} endpoints, best of {ns.repeats} x {ns.requests}"
    )
    print(f"{'least-inflight':<18}{li_us:>8.1f} us/request")
    print(f"{'prefix':<18}{px_us:>8.1f} us/request")
    for name, total in parts.items():
        print(f"  {name:<16}{total / ns.requests * 1e6:>8.1f} us/request (instrumented run)")
    events_us = (parts["events_decode"] + parts["events_apply"]) / ns.requests * 1e6
    share = (px_us - li_us) * 100 / 1e6
    print(
        f"prefix_scoring_cpu: least_inflight_us={li_us:.1f} prefix_us={px_us:.1f} "
        f"prefix_over_least_inflight={px_us / li_us:.3f} events_us={events_us:.1f} "
        f"prefix_core_share_at_100rps={share:.4f}"
    )


if __name__ == "__main__":
    main()
