"""The pieces of `llmgw request ID` without processes: the compact decision, the router's bounded buffer."""

from __future__ import annotations

import json

from llmgw_router.decisions.scheduler import Decision, EndpointScore
from llmgw_router.path.lookup import CANDIDATES_KEPT, RecentRequests, decision_summary

from llmgw.store.records import UsageRecord


def _rec(request_id: str) -> UsageRecord:
    return UsageRecord(time=0.0, request_id=request_id, project="p", model="m", status=200)


def test_the_buffer_keeps_the_last_records_and_every_one_under_a_reused_id() -> None:
    recent = RecentRequests(capacity=3)
    for rid in ("a", "b", "a", "c", "d"):
        recent.add(_rec(rid))
    assert len(recent) <= 3
    assert recent.get("b") == [], "the oldest id went first"
    assert [r.request_id for r in recent.get("c") + recent.get("d")] == ["c", "d"]
    assert recent.get("never") == []


def test_the_decision_keeps_the_winner_and_the_best_candidates_only() -> None:
    scores = tuple(EndpointScore(f"e{i:02d}", {"inflight": i / 100}, i / 100) for i in range(20))
    decision = Decision("e00", "p2c", "inflight", scores, {"stale": 2, "full": 0})
    out = json.loads(json.dumps(decision_summary(decision)))  # as the store keeps it
    ids = [c["id"] for c in out["candidates"]]
    assert len(ids) == CANDIDATES_KEPT and "e00" in ids and "e19" in ids
    assert out["candidates_not_kept"] == 20 - CANDIDATES_KEPT
    assert out["dropped"] == {"stale": 2}, "filters that dropped nothing are left out"
    assert (out["endpoint"], out["picker"], out["by"]) == ("e00", "p2c", "inflight")


def test_a_record_with_its_decision_tags_and_attempts_survives_the_spool() -> None:
    from llmgw.store.usage.usage_spool import decode, encode

    scores = (EndpointScore("e1", {"inflight": 0.5}, 0.5),)
    rec = UsageRecord(
        time=1.0,
        request_id="r",
        project="p",
        model="m",
        status=200,
        endpoint="e1",
        queue_ms=0.25,
        ttft_ms=None,
        attempts=[{"endpoint": "e0", "model": "m", "reason": "engine answered 503"}],
        decision=decision_summary(Decision("e1", "p2c", "only", scores)),
        code="",
        tags={"app": "chat"},
    )
    assert decode(encode(rec)) == rec
