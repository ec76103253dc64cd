"""How long one full placement pass takes: 1,000 nodes of 8 GPUs and 500 models.

Run: .venv/bin/python benchmarks/placement_scale.py [--nodes N] [--models M] [--repeat R]
Prints a small table (best and median of R passes, replicas placed, unplaced) and ends with
`placement_scale: nodes=1000 models=500 seconds=X` (X the median), the line CI greps.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from llmgw.core.config.models import ModelSpec
from llmgw.core.fleet.views import GIB, GpuView, ModelView, NodeView, ReplicaView, ShardView
from llmgw.core.placement import PlacementResult, place
from llmgw.core.reconcile import ReconcileDecision, StartReplica, reconcile

CLASSES = ("h100-80g", "a100-80g", "l40s-48g")


def fleet(n_nodes: int) -> list[NodeView]:
    nodes = []
    for i in range(n_nodes):
        cls = CLASSES[i % len(CLASSES)]
        nodes.append(
            NodeView(
                name=f"node-{i:04d}",
                fabric=f"ib-{i // 32:02d}",
                labels={"zone": f"z{i % 4}"},
                cpu_cores=128,
                memory_bytes=1024 * GIB,
                disk_free_bytes=4000 * GIB,
                gpus=tuple(GpuView(j, cls, 80 * GIB, allocated=(j == 7 and i % 5 == 0)) for j in range(8)),
                engines={"vllm": "0.10.1", "sglang": "0.4.6", "llamacpp": "b11434"},
            )
        )
    return nodes


def catalog(n_models: int) -> dict[str, ModelView]:
    models = {}
    for i in range(n_models):
        gpus = (1, 2, 4, 8)[i % 4]
        profiles = []
        if i % 25 == 0:  # a few multi-node models
            profiles.append(
                {
                    "name": "multi",
                    "engine": "vllm",
                    "gpu_class": "h100-80g",
                    "gpus": 8,
                    "tp": 8,
                    "pp": 2,
                    "nodes": 2,
                }
            )
        profiles.append(
            {
                "name": "main",
                "engine": "vllm" if i % 3 else "sglang",
                "gpu_class": CLASSES[i % len(CLASSES)],
                "gpus": gpus,
                "tp": gpus,
                "min_memory_gb": 16 * gpus,
                "cpu_cores": 4,
                "disk_gb": 20 * gpus,
                "engine_version": "0.10" if i % 3 else None,
            }
        )
        profiles.append(
            {
                "name": "fallback",
                "engine": "vllm",
                "gpu_class": CLASSES[(i + 1) % len(CLASSES)],
                "gpus": gpus,
                "tp": gpus,
            }
        )
        if i % 10 == 9:
            profiles = [{"name": "cpu", "engine": "llamacpp", "cpu_cores": 8, "min_memory_gb": 16}]
        replicas = 1 + i % 3
        spec = ModelSpec.model_validate(
            {"context_length": 8192, "scaling": {"min": replicas, "max": replicas}, "profiles": profiles}
        )
        models[f"model-{i:03d}"] = ModelView(spec, {p["name"]: f"fp{i}{p['name']}" for p in profiles})
    return models


def timed(repeat: int, fn: Callable[[], object]) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--models", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    nodes, models = fleet(args.nodes), catalog(args.models)
    wanted = sum(e.spec.scaling.min for e in models.values())

    place_times, placed = timed(args.repeat, lambda: place(models, nodes, []))
    assert isinstance(placed, PlacementResult)
    running = [
        ReplicaView(
            p.replica_id,
            p.model,
            p.profile,
            p.fingerprint,
            tuple(ShardView(s.node, s.rank, s.gpus, "ready") for s in p.shards),
            "ready",
        )
        for p in placed.placements
    ]
    rng = random.Random(0)
    cold, _ = timed(args.repeat, lambda: reconcile(models, nodes, [], now=0.0, rng=rng))
    warm, converged = timed(args.repeat, lambda: reconcile(models, nodes, running, now=0.0, rng=rng))
    assert isinstance(converged, ReconcileDecision) and not converged.of(StartReplica)

    gpus = sum(len(s.gpus) for p in placed.placements for s in p.shards)
    unplaced = sum(u.missing for u in placed.unplaced)
    print(
        f"{args.nodes} nodes x 8 GPUs, {args.models} models, {wanted} replicas wanted, "
        f"{len(placed.placements)} placed ({gpus} GPUs), {unplaced} unplaced"
    )
    print(f"{'pass':<34} {'best s':>8} {'median s':>9}")
    for name, times in (
        ("place, empty fleet", place_times),
        ("reconcile, empty fleet", cold),
        ("reconcile, converged fleet", warm),
    ):
        print(f"{name:<34} {min(times):>8.3f} {statistics.median(times):>9.3f}")
    median = statistics.median(place_times)
    print(f"placement_scale: nodes={args.nodes} models={args.models} seconds={median:.3f}")


if __name__ == "__main__":
    main()
