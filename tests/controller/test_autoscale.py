"""The autoscaler's pure decision (llmgw.core.fleet.autoscale), its properties, and how the reconciler follows it."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from llmgw.core.config.models import ModelSpec
from llmgw.core.fleet.autoscale import (
    LOAD_TIMES_KEPT,
    Capacity,
    Demand,
    ScalePolicy,
    ScaleState,
    assumed_capacity,
    decide,
    merge_demand,
    published_load_seconds,
)
from llmgw.core.fleet.views import ModelView, NodeView, ReplicaView, ShardView
from llmgw.core.reconcile import StartReplica, StopReplica, Wait, reconcile

POLICY = ScalePolicy(up_cooldown=10.0, down_cooldown=30.0, down_utilization=0.7, stale_after=5.0)
CAP = Capacity(4, "slots")


def run(
    loads: list[int],
    *,
    lo: int = 1,
    hi: int = 8,
    cap: Capacity = CAP,
    step: float = 1.0,
    ttft: float | None = None,
    objective: float | None = None,
) -> list[int]:
    """Feed one load per step (the replicas follow the decision at once) and return the counts decided."""
    state = ScaleState()
    current = lo
    out = []
    for i, load in enumerate(loads):
        now = i * step
        demand = Demand(queued=load // 2, inflight=load - load // 2, ttft_p99_ms=ttft, at=now)
        d = decide(
            "chat",
            min_replicas=lo,
            max_replicas=hi,
            current=current,
            demand=demand,
            capacity=cap,
            objective_ms=objective,
            now=now,
            state=state,
            policy=POLICY,
        )
        state, current = d.state, d.desired
        out.append(d.desired)
    return out


def test_a_burst_scales_straight_to_what_it_needs_and_says_why() -> None:
    d = decide(
        "chat",
        min_replicas=2,
        max_replicas=8,
        current=2,
        demand=Demand(queued=37, inflight=8, at=100.0),
        capacity=Capacity(16, "measured"),
        objective_ms=None,
        now=100.0,
    )
    assert d.desired == 3
    assert d.event == "scaled chat 2->3: queue 37, in flight 8, capacity 16 per replica (measured)"


def test_a_scale_up_waits_out_its_cool_down_before_the_next() -> None:
    counts = run([8] * 3 + [24] * 15)
    assert counts[:3] == [2, 2, 2]
    assert counts[3] == 2  # cool-down of the first scale-up (at t=0) runs to t=10
    assert counts[10] == 6  # then straight to ceil(24 / 4)


def test_scale_down_waits_for_the_cool_down_and_leaves_headroom() -> None:
    counts = run([24] * 2 + [6] * 40)
    assert counts[1] == 6
    # 6 sequences on capacity 4 at 70 %: 3 replicas (2 would run at 75 %), only after 30 s of low load.
    assert counts[30] == 6
    assert counts[-1] == 3


def test_unknown_is_held_not_zero() -> None:
    base = {"min_replicas": 1, "max_replicas": 5, "current": 3, "objective_ms": None, "now": 100.0}
    none = decide("m", demand=None, capacity=CAP, **base)  # type: ignore[arg-type]
    assert (none.desired, none.reason) == (3, "held at 3: no load report")
    stale = decide("m", demand=Demand(queued=50, at=10.0), capacity=CAP, policy=POLICY, **base)  # type: ignore[arg-type]
    assert stale.desired == 3 and "90s old" in stale.reason
    blind = decide("m", demand=Demand(queued=50, at=100.0), capacity=Capacity(None, "unknown"), **base)  # type: ignore[arg-type]
    assert blind.desired == 3 and "capacity unknown" in blind.reason


def test_ttft_over_the_objective_with_a_queue_asks_for_one_more() -> None:
    counts = run([2] * 12, ttft=900.0, objective=500.0)
    assert counts[0] == 2 and counts[10] == 3


def test_assumed_capacity_is_slots_or_the_sims_concurrency() -> None:
    assert assumed_capacity(3, "vllm", {}) == 3
    assert assumed_capacity(None, "sim", {"max_concurrency": 8}) == 8
    assert assumed_capacity(None, "vllm", {"max_concurrency": 8}) is None
    assert assumed_capacity(None, "sim", {"max_concurrency": True}) is None


def test_merge_demand_adds_counts_and_keeps_the_worst_p99() -> None:
    merged = merge_demand(
        [Demand(1, 2, 0, 100.0, 5.0), Demand(3, 4, 1, None, 3.0), Demand(0, 0, 0, 250.0, 4.0)]
    )
    assert merged == Demand(4, 6, 1, 250.0, 3.0)
    assert merge_demand([]) is None


loads_st = st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=120)
bounds_st = st.tuples(st.integers(min_value=0, max_value=6), st.integers(min_value=0, max_value=12)).map(
    lambda b: (b[0], max(b))
)
cap_st = st.integers(min_value=1, max_value=32).map(lambda n: Capacity(n, "measured"))


@settings(max_examples=300, deadline=None)
@given(loads=loads_st, bounds=bounds_st, cap=cap_st)
def test_never_outside_min_max(loads: list[int], bounds: tuple[int, int], cap: Capacity) -> None:
    lo, hi = bounds
    assert all(lo <= n <= hi for n in run(loads, lo=lo, hi=hi, cap=cap))


@settings(max_examples=300, deadline=None)
@given(
    load=st.integers(min_value=0, max_value=200),
    start=st.integers(min_value=1, max_value=10),
    cap=cap_st,
    steps=st.integers(min_value=2, max_value=200),
)
def test_constant_demand_does_not_oscillate(load: int, start: int, cap: Capacity, steps: int) -> None:
    """Whatever count it starts at, a constant load moves it at most once, in one direction, then it stays."""
    state = ScaleState(desired=start)
    current, counts = start, []
    for i in range(steps):
        d = decide(
            "m",
            min_replicas=1,
            max_replicas=10,
            current=current,
            capacity=cap,
            objective_ms=None,
            demand=Demand(queued=0, inflight=load, at=float(i)),
            now=float(i),
            state=state,
            policy=POLICY,
        )
        state, current = d.state, d.desired
        counts.append(d.desired)
    changes = [b - a for a, b in zip([start, *counts], counts, strict=False) if b != a]
    assert len(changes) <= 1, counts


@settings(max_examples=300, deadline=None)
@given(deltas=st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=100), cap=cap_st)
def test_rising_demand_never_lowers_the_count(deltas: list[int], cap: Capacity) -> None:
    loads = [sum(deltas[: i + 1]) for i in range(len(deltas))]
    counts = run(loads, lo=1, hi=20, cap=cap)
    assert counts == sorted(counts)


@settings(max_examples=200, deadline=None)
@given(low=st.integers(min_value=1, max_value=20), high=st.integers(min_value=21, max_value=200), cap=cap_st)
def test_the_count_reached_going_down_is_not_one_the_same_load_scales_up_from(
    low: int, high: int, cap: Capacity
) -> None:
    counts = run([high] * 5 + [low] * 200, lo=1, hi=64, cap=cap)
    settled = counts[-1]
    again = run([low] * 50, lo=settled, hi=64, cap=cap)
    assert again[-1] == settled


# ---------------------------------------------------------------------------------- the reconciler follows


def _model(lo: int, hi: int) -> dict[str, ModelView]:
    spec = ModelSpec.model_validate(
        {
            "context_length": 1024,
            "scaling": {"min": lo, "max": hi},
            "profiles": [{"name": "sim", "engine": "sim", "cpu_cores": 1}],
        }
    )
    return {"chat": ModelView(spec, {"sim": ""})}


def _ready(rid: str, node: str, created: float) -> ReplicaView:
    return ReplicaView(
        rid, "chat", "sim", shards=(ShardView(node, state="ready"),), state="ready", created_at=created
    )


NODES = [NodeView(f"n{i}", cpu_cores=4, memory_bytes=8 << 30, engines={"sim": None}) for i in range(3)]


def test_the_reconciler_places_what_the_autoscaler_asks_for() -> None:
    decision = reconcile(
        _model(1, 4), NODES, [_ready("a", "n0", 1.0)], now=10.0, rng=random.Random(1), scale_to={"chat": 3}
    )
    starts = decision.of(StartReplica)
    assert len(starts) == 2 and decision.targets["chat"] == 3
    assert {s.reason for s in starts} == {"autoscaled to 3 (the routers' load)"}


def test_the_reconciler_keeps_the_asked_count_within_min_and_max() -> None:
    decision = reconcile(
        _model(1, 2), NODES, [_ready("a", "n0", 1.0)], now=10.0, rng=random.Random(1), scale_to={"chat": 9}
    )
    assert decision.targets["chat"] == 2


def test_scale_down_drains_the_idlest_replica() -> None:
    replicas = [_ready("a", "n0", 1.0), _ready("b", "n1", 2.0), _ready("c", "n2", 3.0)]
    # a: busy; b: idle for long; c: never reported by any router (unknown is not idle).
    idleness = {"a": (3, 9.0), "b": (0, 2.0)}
    decision = reconcile(
        _model(1, 4), NODES, replicas, now=10.0, rng=random.Random(1), scale_to={"chat": 2}, idleness=idleness
    )
    stops = decision.of(StopReplica)
    assert [(s.replica_id, s.drain) for s in stops] == [("b", True)]
    assert stops[0].reason == "scale down to 2 (autoscaled: the routers' load fits fewer)"
    # Two down: the idle one, then the busy one, whose requests the drain lets finish. The one nobody
    # reported on is kept: it may be busy through a router that has not said.
    decision = reconcile(
        _model(1, 4), NODES, replicas, now=10.0, rng=random.Random(1), scale_to={"chat": 1}, idleness=idleness
    )
    assert [s.replica_id for s in decision.of(StopReplica)] == ["b", "a"]


def test_a_scale_up_with_no_room_says_what_it_could_not_place() -> None:
    small = [NodeView("n0", cpu_cores=2, memory_bytes=8 << 30, engines={"sim": None})]
    decision = reconcile(
        _model(1, 4), small, [_ready("a", "n0", 1.0)], now=10.0, rng=random.Random(1), scale_to={"chat": 4}
    )
    assert len(decision.of(StartReplica)) == 1  # one more core on n0
    assert decision.unplaced == {"chat": 2}
    [wait] = [w for w in decision.of(Wait) if "cannot be placed" in w.reason]
    assert wait.reason.startswith(
        "2 replicas cannot be placed: no node fits any profile (llmgw explain chat)"
    )


def test_the_published_load_time_is_the_slowest_recent_load_else_the_bench_else_unknown() -> None:
    assert published_load_seconds([], None) is None  # unknown: routers keep their load_timeout
    assert published_load_seconds([], 42.0) == 42.0  # `llmgw bench --save` measured one
    assert published_load_seconds([3.0, 9.5, 4.0], 42.0) == 9.5  # watched loads win over the bench
    old_slow = [600.0] + [5.0] * LOAD_TIMES_KEPT  # a cold first download, long since cached
    assert published_load_seconds(old_slow, None) == 5.0


@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=20), st.none() | st.floats(0, 1e4))
def test_a_hold_is_never_shorter_than_any_recent_load(loads: list[float], bench: float | None) -> None:
    held = published_load_seconds(loads, bench)
    assert held is not None and all(held >= t for t in loads[-LOAD_TIMES_KEPT:])
