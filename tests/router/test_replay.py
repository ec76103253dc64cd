"""The replay's properties: every request is served or refused exactly once, more replicas never make the
p99 TTFT worse on the same trace, a full queue refuses, a wait past the timeout refuses, fair shares hold."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings, strategies as st
from llmgw_router.decisions.replay import SimFleet, SimReplica, replay

from llmgw.core.capacity.engine_model import EngineModel, fit_engine_model
from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.traffic.trace import TracedRequest

CURVE = {
    "prefill_ms_per_token": 0.5,
    "decode_ms_per_token": 10.0,
    "concurrency": 4,
    "curve": [
        {"concurrency": 1, "requests": 20, "failed": 0, "ttft_p50_ms": 64.0, "itl_p50_ms": 10.0},
        {"concurrency": 2, "requests": 20, "failed": 0, "ttft_p50_ms": 70.0, "itl_p50_ms": 11.0},
        {"concurrency": 4, "requests": 20, "failed": 0, "ttft_p50_ms": 90.0, "itl_p50_ms": 14.0},
    ],
}


def _engine() -> EngineModel:
    return fit_engine_model(CURVE, 4, "m/p")


def _fleet(n: int, **kw: object) -> SimFleet:
    engine = _engine()
    return SimFleet(tuple(SimReplica(f"r{i}", "m", engine, engine.capacity) for i in range(n)), **kw)  # type: ignore[arg-type]


def _poisson(rate: float, count: int, seed: int, projects: int = 3) -> list[TracedRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(rate)
        out.append(TracedRequest(t, "m", f"p{i % projects}", 128, rng.randint(8, 128)))
    return out


@settings(max_examples=40, deadline=None)
@given(
    replicas=st.integers(0, 4),
    rate=st.floats(1.0, 200.0),
    count=st.integers(0, 300),
    queue=st.integers(0, 20),
    timeout=st.floats(0.01, 5.0),
    seed=st.integers(0, 1000),
)
def test_every_request_is_served_or_refused_exactly_once(
    replicas: int, rate: float, count: int, queue: int, timeout: float, seed: int
) -> None:
    requests = _poisson(rate, count, seed)
    fleet = _fleet(replicas, model_queue_size=queue, queue_size=queue, queue_timeout_s=timeout)
    result = replay(fleet, requests, seed=seed)
    assert [o.index for o in result.outcomes] == list(range(count))
    for o in result.outcomes:
        assert (o.refused is None) == (o.replica is not None) == (o.ttft_ms is not None)
        if o.refused is None:
            assert o.waited_ms <= timeout * 1000.0 + 1e-6
    m = result.models.get("m")
    if count:
        assert m is not None
        assert m.served + m.refused_total == count
    if replicas == 0 and count:
        assert m is not None and m.refused["unavailable"] == count


def test_more_replicas_never_raise_the_p99_on_the_same_trace() -> None:
    for seed in range(4):
        requests = _poisson(60.0, 3000, seed)
        p99s, refusals = [], []
        for n in range(1, 7):
            result = replay(_fleet(n), requests, seed=seed).models["m"]
            p99s.append(result.ttft_p99_ms)
            refusals.append(result.refused_total)
        assert all(p is not None for p in p99s)
        # Within 1%: a sequence's decode speed follows its replica's load as it changes, so one more
        # replica can reorder a few ends among the requests that wait out most of the timeout either way.
        assert all(b <= a * 1.01 for a, b in itertools.pairwise(p99s)), (seed, p99s)  # type: ignore[operator]
        assert refusals == sorted(refusals, reverse=True), (seed, refusals)
        assert p99s[0] > 2 * p99s[-1]  # the trace overloads one replica: the property is not vacuous


def test_a_full_queue_refuses_the_newcomers() -> None:
    # One replica with one slot, ten requests at once, room for two to wait: one runs, two wait, seven go.
    engine = _engine()
    fleet = SimFleet((SimReplica("r0", "m", engine, 1),), model_queue_size=2, queue_timeout_s=60.0)
    requests = [TracedRequest(0.0, "m", "p", 100, 100) for _ in range(10)]
    result = replay(fleet, requests).models["m"]
    assert result.served == 3
    assert result.refused == {"queue_full": 7, "queue_timeout": 0, "unavailable": 0}


def test_a_wait_past_the_admission_timeout_is_refused() -> None:
    engine = _engine()  # a 100-token answer takes about a second: the second request cannot start in 0.1 s
    fleet = SimFleet((SimReplica("r0", "m", engine, 1),), queue_timeout_s=0.1)
    result = replay(fleet, [TracedRequest(0.0, "m", "p", 100, 100), TracedRequest(0.01, "m", "p", 100, 100)])
    assert [o.refused for o in result.outcomes] == [None, "queue_timeout"]


def test_the_fair_queue_shares_a_busy_model_between_projects() -> None:
    # A project flooding the queue first does not starve one that arrives after it: shares alternate.
    engine = _engine()
    fleet = SimFleet((SimReplica("r0", "m", engine, 1),), queue_timeout_s=1e6, model_queue_size=1000)
    flood = [TracedRequest(0.0, "m", "big", 10, 10) for _ in range(50)]
    late = [TracedRequest(0.001, "m", "small", 10, 10) for _ in range(5)]
    result = replay(fleet, flood + late)
    order = sorted((o for o in result.outcomes), key=lambda o: o.ttft_ms or 0.0)
    small_places = [i for i, o in enumerate(order) if o.index >= 50]
    assert small_places[-1] < 15, small_places  # FIFO would serve them last (places 50..54)


def test_a_higher_priority_project_goes_first() -> None:
    engine = _engine()
    fleet = SimFleet(
        (SimReplica("r0", "m", engine, 1),),
        queue_timeout_s=1e6,
        projects={"vip": (10, 1.0)},
    )
    requests = [TracedRequest(0.0, "m", "std", 10, 10) for _ in range(5)]
    requests.append(TracedRequest(0.001, "m", "vip", 10, 10))
    result = replay(fleet, requests)
    served_order = sorted(result.outcomes, key=lambda o: o.ttft_ms or 0.0)
    assert served_order[1].index == 5  # right after the one already running


def test_sessions_stick_to_their_replica_through_the_real_scheduler() -> None:
    engine = _engine()
    policy = RoutingPolicySpec.model_validate({"weights": {"session": 1.0, "inflight": 0.1}})
    fleet = SimFleet(tuple(SimReplica(f"r{i}", "m", engine, 4) for i in range(4)), policies={"m": policy})
    requests = [TracedRequest(i * 2.0, "m", "p", 10, 10, prefix="abc") for i in range(10)]
    result = replay(fleet, requests)
    assert len({o.replica for o in result.outcomes}) == 1


def test_utilization_is_busy_time_over_capacity() -> None:
    engine = _engine()
    fleet = SimFleet((SimReplica("r0", "m", engine, 4),))
    # One request at a time for 10 s, each 1 token after a 50 ms prefill: busy 0.5 s of 4 slots x 10 s.
    requests = [TracedRequest(float(i), "m", "p", 100, 1) for i in range(10)]
    result = replay(fleet, requests, duration_s=10.0).models["m"]
    assert result.utilization is not None
    assert abs(result.utilization - 0.5 / 40.0) < 1e-9
