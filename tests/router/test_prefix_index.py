"""The prefix indexes' bounds, the fallback when an event stream stops, and the scorer in the scheduler."""

from __future__ import annotations

import random

from hypothesis import given, strategies as st
from llmgw_router.decisions.prefix import ApproxIndex, EventIndex, KvEvent
from llmgw_router.decisions.scheduler import Candidate, RequestInfo, schedule

from llmgw.core.config.models import RoutingPolicySpec

prompts = st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=30), max_size=40)


@given(st.integers(0, 64), prompts)
def test_the_approximate_index_never_holds_more_than_its_capacity(
    capacity: int, recorded: list[list[int]]
) -> None:
    index = ApproxIndex(capacity)
    for hashes in recorded:
        index.record("a", hashes)
        assert index.size("a") <= capacity
    if recorded and capacity >= len(set(recorded[-1])):
        # the prompt recorded last is held whole, from its first block
        assert index.match("a", recorded[-1]) == len(recorded[-1])


@given(st.integers(1, 64), st.lists(st.lists(st.integers(0, 200), max_size=30), max_size=30))
def test_the_event_index_is_bounded(capacity: int, batches: list[list[int]]) -> None:
    index = EventIndex(capacity, stale_after=10)
    for i, hashes in enumerate(batches):
        index.apply("a", [KvEvent("stored", tuple(hashes))], float(i))
        assert index.size("a") <= capacity


def test_events_store_remove_and_clear() -> None:
    index = EventIndex(100, stale_after=10)
    index.apply("a", [KvEvent("stored", (1, 2, 3))], 0.0)
    assert index.match("a", [1, 2, 3, 4]) == 3
    index.apply("a", [KvEvent("removed", (2,))], 1.0)
    assert index.match("a", [1, 2, 3]) == 1  # the prefix ends at the first block missing
    index.apply("a", [KvEvent("cleared")], 2.0)
    assert index.match("a", [1]) == 0


def test_a_stream_never_heard_from_is_not_fresh() -> None:
    index = EventIndex(100, stale_after=10)
    assert not index.fresh("a", 0.0)


@given(
    st.floats(0.1, 100),  # stale_after
    st.lists(
        st.tuples(st.sampled_from(["event", "route_new", "route_cached", "tick"]), st.floats(0, 50)),
        max_size=40,
    ),
)
def test_fresh_exactly_while_no_expected_event_is_overdue(
    stale_after: float, steps: list[tuple[str, float]]
) -> None:
    """A model of the rule: fresh iff some batch arrived and the oldest request since the last batch that
    should have stored blocks is at most stale_after old. Idle engines stay fresh; cached-only requests
    expect nothing."""
    index = EventIndex(100, stale_after)
    now, last_event, waiting_since = 0.0, None, None
    for what, dt in steps:
        now += dt
        if what == "event":
            index.apply("a", [KvEvent("stored", (1,))], now)
            last_event, waiting_since = now, None
        elif what == "route_new":
            index.routed("a", True, now)
            if last_event is not None and waiting_since is None:
                waiting_since = now
        elif what == "route_cached":
            index.routed("a", False, now)
        expected = last_event is not None and (waiting_since is None or now - waiting_since <= stale_after)
        assert index.fresh("a", now) is expected


def _policy() -> RoutingPolicySpec:
    return RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"prefix": 4, "inflight": 1}})


def test_the_endpoint_holding_the_prefix_wins_and_the_rationale_names_the_source() -> None:
    cands = [
        Candidate("a", prefix=0.0, prefix_source="approx"),
        Candidate("b", prefix=0.9, prefix_source="precise"),
        Candidate("c", prefix=0.0, prefix_source="precise"),
    ]
    d = schedule(cands, _policy(), RequestInfo(), random.Random(1))
    assert d.endpoint == "b" and d.winning_scorer == "prefix"
    assert "prefix_by=a:approx,b:precise,c:precise" in d.rationale()


def test_a_full_holder_within_its_bound_stays_eligible_and_load_picks_among_holders() -> None:
    cands = [
        Candidate("a", inflight=4, slots=4, prefix=1.0, prefix_source="precise"),
        Candidate("b", inflight=3, slots=4, prefix=1.0, prefix_source="precise"),
        Candidate("c", inflight=0, slots=4, prefix=0.0, prefix_source="precise"),
    ]
    d = schedule(cands, _policy(), RequestInfo(), random.Random(1))
    assert d.endpoint == "b"  # not the idle replica: it would prefill the whole prompt
    assert d.dropped["full"] == 0 and d.prefix_holder


def test_without_prefix_weight_the_prefix_changes_nothing() -> None:
    policy = RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"inflight": 1}})
    cands = [Candidate("a", inflight=2, prefix=1.0), Candidate("b", inflight=0, prefix=0.0)]
    assert schedule(cands, policy, RequestInfo(), random.Random(1)).endpoint == "b"


def test_a_holder_past_its_load_bound_spills_to_the_next_holder_without_slots() -> None:
    cands = [
        Candidate("a", inflight=6, prefix=1.0, prefix_source="precise"),
        Candidate("b", inflight=2, prefix=0.8, prefix_source="precise"),
        Candidate("c", inflight=0, prefix=0.0, prefix_source="precise"),
    ]
    d = schedule(cands, _policy(), RequestInfo(), random.Random(1))
    # mean with this request 3, ceiling ceil(1.5 * 3) = 5: `a` (7) is past it, `b` (3) is not
    assert d.endpoint == "b", d.rationale()
    assert next(s for s in d.scores if s.id == "a").scores["prefix"] == 0.0
