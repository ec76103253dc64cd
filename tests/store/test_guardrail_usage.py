"""The guardrails' verdict kept with a request's usage row (migration 0012), on SQLite and PostgreSQL."""

from __future__ import annotations

from llmgw.store import Store
from llmgw.store.records import UsageRecord


async def test_the_guard_verdict_round_trips_with_the_usage_row(store: Store) -> None:
    verdict = {
        "input": {"action": "redact", "stage": "input", "rules": ["pii/pii.email"]},
        "output": {"action": "block", "stage": "output", "rules": ["safety/judge"], "hazards": ["S1"]},
    }
    checked = UsageRecord(time=1.0, request_id="r-guard", project="p", model="m", status=400, guard=verdict)
    unchecked = UsageRecord(time=2.0, request_id="r-plain", project="p", model="m", status=200)
    await store.insert_usage([checked, unchecked])
    [got] = await store.usage_by_request("r-guard")
    assert got.guard == verdict
    [plain] = await store.usage_by_request("r-plain")
    assert plain.guard is None  # no guardrail applied: absent, not an empty verdict
    listed = {r.request_id: r.guard for r in await store.list_usage()}
    assert listed == {"r-guard": verdict, "r-plain": None}
