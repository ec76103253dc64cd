"""The pure side of recorded traffic: the prefix hash, per-minute aggregates and their peak concurrency,
how far back usage may be pruned, and a project's content TTL."""

from __future__ import annotations

import pytest

from llmgw.core.config.models import ContentRetention
from llmgw.core.tenancy.limits import window_bounds
from llmgw.core.traffic.recorded import (
    Finished,
    aggregate_minutes,
    content_ttl,
    merge_minutes,
    prefix_hash,
    trace_salt,
    usage_cutoff,
)

T0 = 1_800_000_000.0  # a minute boundary


def done(at: float, latency: float, project: str = "p", status: int = 200) -> Finished:
    return Finished(at, latency, "m", project, "", status, 3, 4, 0.5)


def test_the_prefix_hash_is_per_project_per_salt_and_stable() -> None:
    salt = trace_salt(b"cluster secret").encode()
    assert prefix_hash(salt, "a", "head:x") == prefix_hash(salt, "a", "head:x")
    assert prefix_hash(salt, "a", "head:x") != prefix_hash(salt, "b", "head:x")
    assert prefix_hash(salt, "a", "head:x") != prefix_hash(trace_salt(b"another").encode(), "a", "head:x")
    # The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert prefix_hash(salt, "ab", "c") != prefix_hash(salt, "a", "bc")
    assert len(prefix_hash(salt, "a", "user:alice")) == 24
    with pytest.raises(ValueError, match="non-empty cluster secret"):
        trace_salt(b"")


def test_peak_concurrency_counts_overlaps_and_requests_finishing_later() -> None:
    batch = [done(T0 + 10, 10), done(T0 + 15, 10), done(T0 + 30, 5), done(T0 + 40, 1, status=503)]
    later = [done(T0 + 200, 180)]  # arrived at T0+20, finished two minutes on: in flight in minute 0
    [minute] = aggregate_minutes(batch, later)
    assert (minute.requests, minute.errors, minute.tokens_in, minute.tokens_out) == (4, 1, 12, 16)
    assert minute.cost == pytest.approx(2.0)
    # T0+5..10, T0+5..15 and the long one from T0+20; T0+25..30 overlaps the long one only.
    assert minute.peak_concurrency == 2
    assert aggregate_minutes(batch)[0].peak_concurrency == 2
    # A hand-over at one instant (one finishes as another arrives) is not two at once.
    [handover] = aggregate_minutes([done(T0 + 10, 5), done(T0 + 15, 5)])
    assert handover.peak_concurrency == 1


def test_a_request_spanning_minutes_counts_in_each_and_groups_stay_apart() -> None:
    rows = [done(T0 + 130, 125), done(T0 + 20, 5), done(T0 + 70, 1, project="q")]
    got = {(m.minute, m.project): m.peak_concurrency for m in aggregate_minutes(rows)}
    # The long one (T0+5..T0+130) overlaps the minute-0 request; project q is its own group.
    assert got == {(T0, "p"): 2, (T0 + 60, "q"): 1, (T0 + 120, "p"): 1}


def test_merging_adds_counts_and_keeps_the_larger_known_peak() -> None:
    [a] = aggregate_minutes([done(T0 + 10, 1)])
    b = a.__class__(*a.key, 2, 1, 6, 8, 1.0, None)
    merged = merge_minutes(a, b)
    assert (merged.requests, merged.errors, merged.peak_concurrency) == (3, 1, 1)
    assert merge_minutes(b, b).peak_concurrency is None, "unknown merged with unknown stays unknown"


def test_usage_is_not_pruned_inside_a_budget_window() -> None:
    now = T0 + 12345
    assert usage_cutoff(now, 86400, []) == now - 86400
    start, _ = window_bounds(now, 30 * 86400)
    assert usage_cutoff(now, 60, [30 * 86400, 3600]) == min(start, now - 60)


def test_only_an_opt_in_gives_a_content_ttl() -> None:
    assert content_ttl(None) is None
    assert content_ttl(ContentRetention(content=False, ttl="1h")) is None
    assert content_ttl(ContentRetention(content=True, ttl="1h")) == 3600.0
    assert content_ttl(ContentRetention(content=True)) == 7 * 86400.0
