"""Recorded traffic in a real store (SQLite and PostgreSQL): the shape columns, export and import of a trace,
pruning into per-minute aggregates, and sealed content with a TTL."""

from __future__ import annotations

import base64
import os

import pytest

from llmgw.adapters.traffic import export_lines, import_trace
from llmgw.core.traffic.recorded import IMPORT_PREFIX
from llmgw.core.traffic.trace import parse_trace
from llmgw.store import Store, UsageRecord
from llmgw.store.queries.content import ContentError, ContentVault, parse_content_key

T0 = 1_800_000_000.0  # a minute boundary (divisible by 60)


def rec(done: float, latency_s: float, **kw: object) -> UsageRecord:
    fields: dict[str, object] = {
        "project": "p",
        "model": "m",
        "status": 200,
        "tokens_in": 10,
        "tokens_out": 5,
    }
    fields.update(kw)
    return UsageRecord(time=done, request_id=f"r{done}", latency_ms=latency_s * 1000, **fields)  # type: ignore[arg-type]


async def test_a_rows_shape_reads_back_and_unknown_stays_unknown(store: Store) -> None:
    await store.insert_usage(
        [rec(T0 + 1, 1, stream=True, prefix="a" * 24), rec(T0 + 2, 1, stream=False), rec(T0 + 3, 1)]
    )
    rows = await store.usage_page(T0, T0 + 60)
    assert [(r.stream, r.prefix) for r in rows] == [(True, "a" * 24), (False, None), (None, None)]


async def test_export_writes_arrival_order_and_import_marks_and_dedupes(
    store: Store, tmp_path: object
) -> None:
    # Completion order is not arrival order: the long request arrived first and finished last.
    await store.insert_usage(
        [
            rec(T0 + 10, 2, prefix="x" * 24, stream=True, ttft_ms=50.0),
            rec(T0 + 20, 19, status=429),
            rec(T0 + 30, 1),
        ]
    )
    lines = [line async for line in export_lines(store, T0, T0 + 60)]
    trace = parse_trace(lines)
    assert [r.t for r in trace.requests] == [1.0, 8.0, 29.0]
    assert [line for line in lines[1:]] == sorted(lines[1:], key=lambda x: float(x.split(",")[0][5:]))
    first = trace.requests[0]
    assert (first.status, first.duration_ms, first.prompt_tokens, first.completion_tokens) == (
        429,
        19000.0,
        10,
        5,
    )
    assert (trace.requests[1].prefix, trace.requests[1].stream, trace.requests[1].ttft_ms) == (
        "x" * 24,
        True,
        50.0,
    )
    # Only the model asked for; an old row's stream comes from whether it had a time to first token.
    assert [line async for line in export_lines(store, T0, T0 + 60, model="other")][1:] == []

    done = await import_trace(store, trace, "lastweek", "digest-1")
    assert (done.imported, done.read) == (3, 3)
    again = await import_trace(store, trace, "lastweek", "digest-1")
    assert again.imported == 0, "the same trace imported twice is kept once"
    rows = await store.usage_page(T0, T0 + 60)
    imported = [r for r in rows if r.router_id == IMPORT_PREFIX + "lastweek"]
    assert len(imported) == 3
    assert sorted(r.time for r in imported) == [T0 + 10, T0 + 20, T0 + 30], "completion = arrival + duration"


async def test_pruning_folds_whole_minutes_into_aggregates_in_bounded_batches(store: Store) -> None:
    # Minute 0: three requests, two overlapping; minute 1: one request in flight across the boundary plus
    # one that started there; minute 2: one request; minute 3 is after the cutoff and stays.
    await store.insert_usage(
        [
            rec(T0 + 10, 5),
            rec(T0 + 12, 4, status=500),
            rec(T0 + 50, 1, project="q"),
            rec(T0 + 70, 20),  # arrived at T0+50: in flight in minutes 0 and 1
            rec(T0 + 75, 10),
            rec(T0 + 130, 1),
            rec(T0 + 200, 1),
        ]
    )
    first = await store.prune_usage(T0 + 180, batch=4)
    assert first.rows == 3, "a batch stops before the minute it cut through"
    minutes = {(m.minute, m.project): m for m in await store.usage_minutes(T0, T0 + 600)}
    zero = minutes[(T0, "p")]
    assert (zero.requests, zero.errors, zero.tokens_in, zero.tokens_out) == (2, 1, 20, 10)
    # T0+6..T0+10 and T0+8..T0+12 overlap; the request arriving at T0+50 (completed later) is counted too.
    assert zero.peak_concurrency == 2
    assert minutes[(T0, "q")].requests == 1
    while (await store.prune_usage(T0 + 180, batch=4)).rows:
        pass
    minutes = {(m.minute, m.project): m for m in await store.usage_minutes(T0, T0 + 600)}
    assert (minutes[(T0 + 60, "p")].requests, minutes[(T0 + 60, "p")].peak_concurrency) == (2, 2)
    assert minutes[(T0 + 120, "p")].requests == 1
    left = await store.usage_page(0, T0 + 600)
    assert [r.time for r in left] == [T0 + 200]
    # A late row for a minute already folded adds to it rather than replacing it.
    await store.insert_usage([rec(T0 + 15, 1)])
    await store.prune_usage(T0 + 180)
    merged = {(m.minute, m.project): m for m in await store.usage_minutes(T0, T0 + 60)}
    assert merged[(T0, "p")].requests == 3
    assert await store.prune_usage_minutes(T0 + 60) == 2
    assert {m.minute for m in await store.usage_minutes(0, T0 + 600)} == {T0 + 60, T0 + 120}


async def test_one_minute_larger_than_a_batch_is_taken_whole(store: Store) -> None:
    await store.insert_usage([rec(T0 + i / 10, 0.05) for i in range(30)])
    done = await store.prune_usage(T0 + 120, batch=10)
    assert done.rows == 30
    [minute] = await store.usage_minutes(T0, T0 + 60)
    assert (minute.requests, minute.peak_concurrency) == (30, 1)


async def test_imported_rows_aggregate_apart_from_recorded_ones(store: Store) -> None:
    await store.insert_usage(
        [rec(T0 + 1, 1), rec(T0 + 2, 1, router_id="import:x"), rec(T0 + 3, 1, router_id="r1")]
    )
    await store.prune_usage(T0 + 60)
    got = {m.source: m.requests for m in await store.usage_minutes(T0, T0 + 60)}
    assert got == {"": 2, "import:x": 1}


async def test_content_is_sealed_bound_to_its_name_and_gone_at_expiry(store: Store) -> None:
    key = os.urandom(32)
    vault = ContentVault(store, key)
    expires = await vault.put("response", "p", "resp_1", b"secret words", ttl_s=60, now=T0)
    assert expires == T0 + 60
    kept = await vault.get("response", "p", "resp_1", now=T0 + 59)
    assert kept is not None and kept.data == b"secret words"
    async with store.db.tx() as tx:
        [(sealed,)] = await tx.fetch("SELECT sealed FROM content")
    assert b"secret words" not in base64.b64decode(sealed), "encrypted at rest"
    assert await vault.get("response", "other", "resp_1", now=T0) is None, "another project sees nothing"
    # A row moved to another id does not open: the kind, project and id are the associated data.
    async with store.db.tx() as tx:
        await tx.execute("UPDATE content SET id = 'resp_2' WHERE id = 'resp_1'")
    with pytest.raises(ContentError, match="altered"):
        await vault.get("response", "p", "resp_2", now=T0)
    with pytest.raises(ContentError, match="another content key"):
        await ContentVault(store, os.urandom(32)).get("response", "p", "resp_2", now=T0)
    assert await vault.get("response", "p", "resp_2", now=T0 + 60) is None, "expired reads as absent"
    assert await store.prune_content(T0 + 60) == 1
    assert (await store.row_counts())["content"] == 0
    with pytest.raises(ContentError, match="TTL must be positive"):
        await vault.put("response", "p", "x", b"", ttl_s=0, now=T0)


async def test_a_projects_content_is_deleted_whole_and_a_put_replaces(store: Store) -> None:
    vault = ContentVault(store, os.urandom(32))
    await vault.put("cache", "p", "a", b"1", 60, T0)
    await vault.put("cache", "p", "a", b"2", 60, T0 + 1)
    await vault.put("cache", "q", "a", b"3", 60, T0)
    got = await vault.get("cache", "p", "a", T0 + 2)
    assert got is not None and got.data == b"2"
    assert await store.content_projects() == ["p", "q"]
    assert await store.delete_project_content("p") == 1
    assert await vault.delete("cache", "q", "a")
    assert not await vault.delete("cache", "q", "a")


def test_a_content_key_must_be_32_bytes_of_base64() -> None:
    assert parse_content_key(base64.b64encode(b"k" * 32).decode() + "\n", "f") == b"k" * 32
    with pytest.raises(ContentError, match="f: the content key is 16 bytes; it must be 32"):
        parse_content_key(base64.b64encode(b"k" * 16).decode(), "f")
    with pytest.raises(ContentError, match="not base64"):
        parse_content_key("not base64!", "f")
