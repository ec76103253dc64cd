"""How long `plan --simulate` takes on a day of a 50-node fleet's traffic.

The fleet: `--nodes` nodes (50), one replica each, spread over `--models` models (5); every replica's engine
model is fitted (`llmgw.core.capacity.engine_model.fit_engine_model`) from CURVE, a stored `llmgw bench --save`
measurement of a GPU replica with 8 slots whose inter-token latency grows with its load and a tenth of whose
prefills holds the replica (the share the fit reads from what it completed at 8). Each model
gets a 24-hour diurnal trace (`llmgw.core.traffic.synthetic_trace.diurnal`: trough at 04:00, peak at 16:00) whose peak
is `--peak` (0.8) of its replicas' modelled capacity; requests have 256-token prompts and ~600-token answers
(+-50%), so a day is about a million requests. The replay (`llmgw_router.decisions.replay`: the router's scheduler and
fair queue, per request) runs in this one process, so it uses one core however many the machine has.

Printed: the trace's size and how long it took to make, the replay's seconds, the requests served and
refused, and the peak utilization: the busiest 5-minute bucket's busy slot-seconds over the fleet's slot-seconds
in it. The last line is machine-readable; the issue's target is seconds < 120 with peak_utilization >= 0.7:

  replay_scale: nodes=50 requests=N peak_utilization=X seconds=X

Run: .venv/bin/python benchmarks/replay_scale.py [--nodes 50] [--models 5] [--hours 24] [--peak 0.75]
"""

from __future__ import annotations

import argparse
import random
import time

from llmgw_router.decisions.replay import SimFleet, SimReplica, replay

from llmgw.core.capacity.engine_model import fit_engine_model
from llmgw.core.traffic.synthetic_trace import Shape, diurnal
from llmgw.core.traffic.trace import TracedRequest

# A measured curve of the shape `llmgw bench --save` stores (ms; steps at concurrency 1..16 of an 8-slot replica,
# 256-token prompts, 800-token answers, and the short step at 64 tokens); at 8 it completed what a share of 0.1
# of each prefill holding the replica gives (`llmgw.core.capacity.engine_model`).
CURVE = {
    "concurrency": 8,
    "prefill_ms_per_token": 0.4,
    "decode_ms_per_token": 22.0,
    "curve": [
        {
            "concurrency": 1,
            "requests": 60,
            "failed": 0,
            "seconds": 1059.5,
            "ttft_p50_ms": 102.0,
            "itl_p50_ms": 22.0,
            "tokens_per_s": 45.3,
            "prompt_tokens": 256.0,
        },
        {
            "concurrency": 1,
            "requests": 60,
            "failed": 0,
            "seconds": 1056.0,
            "ttft_p50_ms": 25.6,
            "itl_p50_ms": 22.0,
            "tokens_per_s": 45.4,
            "prompt_tokens": 64.0,
        },
        {
            "concurrency": 2,
            "requests": 80,
            "failed": 0,
            "ttft_p50_ms": 110.0,
            "itl_p50_ms": 23.5,
            "prompt_tokens": 256.0,
        },
        {
            "concurrency": 4,
            "requests": 120,
            "failed": 0,
            "ttft_p50_ms": 131.0,
            "itl_p50_ms": 26.0,
            "prompt_tokens": 256.0,
        },
        {
            "concurrency": 8,
            "requests": 200,
            "failed": 0,
            "seconds": 623.6,
            "ttft_p50_ms": 180.0,
            "itl_p50_ms": 31.0,
            "tokens_per_s": 256.6,
            "prompt_tokens": 256.0,
        },
        {
            "concurrency": 16,
            "requests": 220,
            "failed": 0,
            "ttft_p50_ms": 2900.0,
            "itl_p50_ms": 31.5,
            "prompt_tokens": 256.0,
        },
    ],
}
SLOTS = 8
BUCKET_S = 300.0
SHAPE = Shape(prompt_tokens=256, completion_tokens=800, spread=0.5, project="day")


def build(
    nodes: int, models: int, hours: float, peak: float, seed: int
) -> tuple[SimFleet, list[TracedRequest]]:
    engine = fit_engine_model(CURVE, SLOTS, "chat/gpu")
    names = [f"chat-{m}" for m in range(models)]
    replicas = tuple(SimReplica(f"node-{i:03d}", names[i % models], engine, SLOTS) for i in range(nodes))
    per_replica = engine.requests_per_s(SHAPE.prompt_tokens, SHAPE.completion_tokens)
    rng = random.Random(seed)
    requests: list[TracedRequest] = []
    for name in names:
        count = sum(1 for r in replicas if r.model == name)
        _, part = diurnal(name, peak * per_replica * count, rng, hours=hours, shape=SHAPE)
        requests.extend(part)
    requests.sort(key=lambda r: r.t)
    return SimFleet(replicas, queue_size=4096, model_queue_size=1024, queue_timeout_s=30.0), requests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=50)
    p.add_argument("--models", type=int, default=10)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--peak", type=float, default=0.8, help="the trace's peak, as a share of capacity")
    p.add_argument("--seed", type=int, default=24)
    args = p.parse_args()
    t0 = time.perf_counter()
    fleet, requests = build(args.nodes, args.models, args.hours, args.peak, args.seed)
    made_s = time.perf_counter() - t0
    t1, cpu = time.perf_counter(), time.process_time()
    result = replay(fleet, requests, seed=args.seed, duration_s=args.hours * 3600.0, bucket_s=BUCKET_S)
    seconds, cpu = time.perf_counter() - t1, time.process_time() - cpu
    buckets = result.busy_by_bucket[: max(1, int(args.hours * 3600.0 / BUCKET_S))]
    peak_util = max(buckets) / (result.capacity_slots * BUCKET_S) if result.capacity_slots else 0.0
    served = sum(m.served for m in result.models.values())
    refused = sum(m.refused_total for m in result.models.values())
    print(f"fleet: {args.nodes} nodes, {args.models} models, {result.capacity_slots} slots")
    print(f"trace: {len(requests)} requests over {args.hours:g} h, made in {made_s:.1f} s")
    print(f"replay: {seconds:.1f} s ({cpu:.1f} s of CPU); served {served}, refused {refused}")
    for m in result.models.values():
        print(
            f"  {m.model}: p50 {m.ttft_p50_ms or 0:.0f} ms, p99 {m.ttft_p99_ms or 0:.0f} ms, "
            f"utilization {m.utilization or 0:.0%}"
        )
    print(
        f"replay_scale: nodes={args.nodes} requests={len(requests)} peak_utilization={peak_util:.3f} "
        f"seconds={seconds:.1f}"
    )


if __name__ == "__main__":
    main()
