"""Every store method, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import math
import re
from importlib import resources
from typing import Any

import pytest

from llmgw.store import (
    TABLES,
    ApiKey,
    Fence,
    LeaseFenced,
    ReplicaRecord,
    Revision,
    Store,
    StoreError,
    UsageRecord,
    parse_dsn,
)
from llmgw.store.migrate import check_pairs, load_migrations, migrate, split_statements

from .orphans import delete_key_behind_the_foreign_key


async def test_migrations_are_idempotent(store: Store) -> None:
    version = await store.schema_version()
    assert version == max(m.version for m in load_migrations())
    assert await store.migrate() == []  # nothing left to apply
    assert await migrate(store.db) == []
    assert await store.schema_version() == version
    assert set((await store.row_counts()).keys()) == set(TABLES)


async def test_store_from_the_future_is_refused(store: Store) -> None:
    async with store.db.tx() as tx:
        await tx.execute("INSERT INTO schema_version (version, name, applied_at) VALUES (9999, 'future', 0)")
    with pytest.raises(StoreError, match="newer than this llmgw knows"):
        await store.migrate()


def test_a_dialect_migration_comes_in_pairs_and_keeps_trigger_bodies_whole() -> None:
    """`NNNN_x.sqlite.sql` needs its `NNNN_x.postgres.sql`; a trigger's `;`-ended body stays one statement."""
    statements = split_statements(
        "CREATE TABLE t (a TEXT);\nCREATE TRIGGER g AFTER INSERT ON t BEGIN\n  INSERT INTO u VALUES (1);\n"
        "  INSERT INTO u VALUES (2);\nEND;\nSELECT 1;"
    )
    assert [s.split()[1] for s in statements] == ["TABLE", "TRIGGER", "1"]
    assert statements[1].endswith("INSERT INTO u VALUES (2);\nEND")
    with pytest.raises(StoreError, match="never closed with END"):
        split_statements("CREATE TRIGGER g AFTER INSERT ON t BEGIN INSERT INTO u VALUES (1);")
    sqlite_only = [m for m in load_migrations() if m.dialect != "postgres"]
    with pytest.raises(StoreError, match="written for \\['sqlite'\\] only"):
        check_pairs(sqlite_only)


def test_move_order_respects_foreign_keys() -> None:
    """Derived from the migrations, not restated: every referenced table is copied before its referrer."""
    sql = "\n".join(
        f.read_text("utf-8") for f in resources.files("llmgw.store").joinpath("migrations").iterdir()
    )
    dropped = set(re.findall(r"^DROP TABLE (\w+)", sql, re.M))
    tables = [
        (name, body)
        for name, body in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\);", sql, re.S)
        if name not in dropped
    ]
    assert {name for name, _ in tables} == set(TABLES)
    for name, body in tables:
        for parent in re.findall(r"REFERENCES (\w+)", body):
            assert TABLES.index(parent) < TABLES.index(name), f"{name} references {parent}"


async def test_revisions(store: Store) -> None:
    await store.record_revision(Revision("a" * 40, "git@x:repo", 10.0, "controller-1", "accepted"))
    await store.record_revision(
        Revision("b" * 40, "git@x:repo", 20.0, "controller-1", "refused", ("bad: x",))
    )
    revs = await store.list_revisions()
    assert [r.sha[0] for r in revs] == ["b", "a"]
    assert revs[0].errors == ("bad: x",)
    last = await store.last_accepted_revision()
    assert last is not None and last.sha == "a" * 40


async def test_nodes_keep_first_seen(store: Store) -> None:
    await store.upsert_node("n1", "Ready", {"cpu": 8}, now=1.0)
    await store.upsert_node("n1", "Ready", {"cpu": 16}, now=5.0)
    assert await store.set_node_state("n1", "Unreachable")
    assert not await store.set_node_state("nope", "Lost")
    [node] = await store.list_nodes()
    assert (node.first_seen, node.last_seen, node.state, node.inventory) == (
        1.0,
        5.0,
        "Unreachable",
        {"cpu": 16},
    )
    assert await store.delete_node("n1")
    assert await store.list_nodes() == []


async def test_node_drains_are_kept_until_cleared(store: Store) -> None:
    await store.set_node_drain("n1", "by ops at t1", now=1.0)
    await store.set_node_drain("n1", "by ops at t2", now=2.0)  # drained again: the newer words
    await store.set_node_drain("n2", "by ci at t3", now=3.0)
    assert await store.list_node_drains() == {"n1": "by ops at t2", "n2": "by ci at t3"}
    assert await store.clear_node_drain("n1")
    assert not await store.clear_node_drain("n1")
    assert await store.list_node_drains() == {"n2": "by ci at t3"}


async def test_replicas(store: Store) -> None:
    r = ReplicaRecord("r1", "sim-chat", "sim", ("n1", "n2"), "starting", "fp1", 1.0, 1.0)
    await store.upsert_replica(r)
    await store.upsert_replica(ReplicaRecord("r1", "sim-chat", "sim", ("n1",), "ready", "fp2", 9.0, 2.0))
    await store.upsert_replica(ReplicaRecord("r2", "other", "sim", (), "ready", "fp", 1.0, 1.0))
    [got] = await store.list_replicas(model="sim-chat")
    assert (got.nodes, got.state, got.fingerprint, got.created_at, got.updated_at) == (
        ("n1",),
        "ready",
        "fp2",
        1.0,
        2.0,
    )
    assert len(await store.list_replicas()) == 2
    assert await store.delete_replica("r1")
    assert [x.id for x in await store.list_replicas()] == ["r2"]


async def test_events(store: Store) -> None:
    for i in range(5):
        await store.add_event("replica", f"r{i}", f"message {i}", now=float(i))
    recent = await store.recent_events(limit=3)
    assert [e.object for e in recent] == ["r4", "r3", "r2"]
    assert [e.object for e in await store.recent_events(since=3.0)] == ["r4", "r3"]
    assert await store.prune_events(before=2.0) == 2
    assert len(await store.recent_events()) == 3


async def test_keys(store: Store) -> None:
    key = ApiKey("key_1", "sk-llmgw-abcd", "playground", "ci", 1.0, 100.0, None)
    await store.insert_key(key, "h" * 64)
    assert await store.get_key("key_1") == key
    found = await store.lookup_key("h" * 64, now=50.0)
    assert found is not None and (found.project, found.state) == ("playground", "active")
    expired = await store.lookup_key("h" * 64, now=100.0)
    assert expired is not None and expired.state == "expired"
    assert await store.lookup_key("x" * 64, now=1.0) is None
    assert await store.revoke_key("key_1", now=60.0)
    assert await store.revoke_key("key_1", now=70.0)  # still there; the first time is kept
    assert not await store.revoke_key("key_nope", now=70.0)
    revoked = await store.lookup_key("h" * 64, now=61.0)
    assert revoked is not None and revoked.state == "revoked"
    [listed] = await store.list_keys(project="playground")
    assert listed.revoked_at == 60.0
    assert await store.list_keys(project="other") == []


async def test_usage_insert_is_idempotent_and_totals_add_up(store: Store) -> None:
    await store.insert_key(ApiKey("k1", "sk-llmgw-x", "p1", "", 0.0, None, None), "h1")
    records = [
        UsageRecord(
            time=float(i),
            request_id=f"req{i}",
            project="p1" if i % 2 else "p2",
            team="t",
            org="o",
            key_id="k1" if i % 2 else None,
            model="m",
            status=200 if i < 8 else 500,
            tokens_in=10 + i,
            tokens_out=i,
            cost=0.5,
            latency_ms=100.0,
            fallback_used=i == 3,
        )
        for i in range(10)
    ]
    await store.insert_usage(records)
    await store.insert_usage(records[:4])  # a retried batch: not counted twice
    assert len(await store.list_usage()) == 10
    by_project = {t.group: t for t in await store.usage_totals("project")}
    assert by_project["p1"].requests == 5 and by_project["p2"].requests == 5
    assert sum(t.tokens_in for t in by_project.values()) == sum(r.tokens_in for r in records)
    assert sum(t.tokens_out for t in by_project.values()) == sum(r.tokens_out for r in records)
    assert by_project["p1"].errors + by_project["p2"].errors == 2
    [org] = await store.usage_totals("org", since=5.0)
    assert (org.group, org.requests, org.cost) == ("o", 5, 2.5)
    keys = {t.group: (t.requests, t.key_name, t.key_project) for t in await store.usage_totals("key")}
    assert keys == {"": (5, None, None), "k1": (5, "", "p1")}  # no key: no name; k1's name is empty
    assert {t.key_name for t in await store.usage_totals("project")} == {None}
    assert await store.spend("project", "p1", since=0.0) == pytest.approx(2.5)
    assert await store.spend("team", "t", since=0.0, until=4.0) == pytest.approx(2.0)
    with pytest.raises(StoreError):
        await store.usage_totals("user")  # type: ignore[arg-type]
    back = (await store.list_usage(since=3.0, limit=1))[0]
    assert back == records[3]


async def test_a_usage_rows_json_columns_read_back_as_the_values_written(store: Store) -> None:
    # orjson writes most of them; what it would write as another value (a NaN, an infinity) or cannot write
    # (an integer past 64 bits, a lone surrogate, a key that is not a string) is json's, read back alike.
    values: list[dict[str, Any]] = [
        {
            "endpoint": "e1",
            "by": None,
            "candidates": [{"id": "e1", "total": 0.5, "scores": {"prefix": 1e-07}}],
        },
        {"endpoint": "é—ü", "by": "kv", "candidates": []},
        {"endpoint": "e2", "score": math.inf, "by": None},
        {"endpoint": "e3", "big": 2**70},
        {"endpoint": "\ud800"},
        {"endpoint": "e4", "dropped": {7: 1}},
    ]
    records = [
        UsageRecord(
            time=float(i),
            request_id=f"json{i}",
            project="p",
            model="m",
            status=200,
            decision=v,
            guard={"input": {"action": "pass", "rules": [], "judge": None}},
            attempts=[{"endpoint": str(i)}],
        )
        for i, v in enumerate(values)
    ]
    await store.insert_usage(records)
    back = {r.request_id: r for r in await store.list_usage()}
    for rec in records:
        got = back[rec.request_id]
        assert json.dumps(got.decision, sort_keys=True) == json.dumps(
            rec.decision, sort_keys=True, default=str
        )
        assert (got.guard, got.attempts) == (rec.guard, rec.attempts)


async def test_usage_by_key_names_each_key_and_still_counts_keys_gone_from_the_store(store: Store) -> None:
    await store.insert_key(ApiKey("key_a", "sk-llmgw-a", "search", "ci", 0.0, None, None), "ha")
    await store.insert_key(ApiKey("key_b", "sk-llmgw-b", "chat", "web", 0.0, None, None), "hb")
    await store.insert_usage(
        [
            UsageRecord(
                time=float(i),
                request_id=f"r{i}",
                project=project,
                model="m",
                status=200,
                key_id=key,
                tokens_in=10,
                cost=1.0,
            )
            for i, (key, project) in enumerate(
                [("key_a", "search"), ("key_a", "search"), ("key_b", "chat"), (None, "open")]
            )
        ]
    )
    await delete_key_behind_the_foreign_key(store, "key_b")
    totals = await store.usage_totals("key")
    assert [(t.group, t.key_name, t.key_project, t.requests, t.tokens_in) for t in totals] == [
        ("", None, None, 1, 10),  # no key
        ("key_a", "ci", "search", 2, 20),
        ("key_b", None, None, 1, 10),  # its key is gone: name and project unknown, usage still counted
    ]
    assert sum(t.cost for t in totals) == 4.0


async def test_a_batch_larger_than_one_insert_statement_is_written_whole_or_not_at_all(store: Store) -> None:
    records = [
        UsageRecord(time=float(i), request_id=f"r{i}", project="p", model="m", status=200, tokens_in=i)
        for i in range(150)
    ]
    await store.insert_usage(records)  # statements of 32, 32, 32, 32, 16, 4 and 2 rows, one transaction
    await store.insert_usage(records[50:130])  # a retried batch across statement boundaries: skipped
    written = await store.list_usage(limit=1000)
    assert [r.request_id for r in written] == [f"r{i}" for i in range(150)]
    bad = [
        *records[:70],
        UsageRecord(time=1.0, request_id="x", project="p", model="m", status=200, key_id="no-such-key"),
    ]
    with pytest.raises(StoreError):
        await store.insert_usage(bad)  # the foreign key fails in the last statement (32, 32, 4, 2, 1)
    assert len(await store.list_usage(limit=1000)) == 150  # and the first statement was rolled back with it


def test_rows_go_in_chunks_of_few_shapes_in_order() -> None:
    from llmgw.store.db import row_chunks

    shapes: set[int] = set()
    for n in range(200):
        chunks = list(row_chunks(list(range(n)), 32))
        assert [x for c in chunks for x in c] == list(range(n))
        shapes.update(len(c) for c in chunks)
    assert shapes == {1, 2, 4, 8, 16, 32}  # six statements to compile whatever the batches' sizes
    assert [len(c) for c in row_chunks(list(range(50)), 32)] == [32, 16, 2]


def test_usage_ids_are_uuid7_and_grow_with_time() -> None:
    import uuid

    from llmgw.store.records import time_ordered_id

    first = time_ordered_id()
    parsed = uuid.UUID(first)
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert len({time_ordered_id() for _ in range(10_000)}) == 10_000
    later = UsageRecord(time=0.0, request_id="r", project="p", model="m", status=200)
    # The first 48 bits are milliseconds: a later id never sorts before an id from an earlier millisecond.
    assert int(later.id[:12], 16) >= int(first[:12], 16)


async def test_take_share_never_grants_past_the_limit(store: Store) -> None:
    grants = [await store.take_share("p:rpm", 0.0, 60.0, 4, 10, now=1.0) for _ in range(4)]
    assert [g.granted for g in grants] == [4, 4, 2, 0]
    assert [g.taken for g in grants] == [4, 8, 10, 10]
    other = await store.take_share("p:rpm", 60.0, 120.0, 4, 10, now=61.0)
    assert (other.granted, other.taken) == (4, 4)  # a new window starts empty
    assert await store.counter_taken("p:rpm", 0.0) == 10
    assert not await store.seed_counter("p:rpm", 0.0, 60.0, 3, now=1.0)  # exists: left alone
    assert await store.seed_counter("p:budget", 0.0, 86400.0, 7, now=1.0)
    assert (await store.take_share("p:budget", 0.0, 86400.0, 5, 10, now=2.0)).granted == 3
    assert await store.prune_counters(before=100.0) == 1


async def test_lease_held_by_one_until_expiry(store: Store) -> None:
    a = await store.acquire_lease("leader", "a", ttl=10.0, now=100.0)
    assert a.held and a.current is not None and a.current.holder == "a"
    b = await store.acquire_lease("leader", "b", ttl=10.0, now=105.0)
    assert not b.held and b.current is not None and b.current.holder == "a"
    renewed = await store.acquire_lease("leader", "a", ttl=10.0, now=108.0)
    assert renewed.held and renewed.current is not None and renewed.current.expires_at == 118.0
    assert not (await store.acquire_lease("leader", "b", ttl=10.0, now=117.9)).held
    taken = await store.acquire_lease("leader", "b", ttl=10.0, now=118.0)
    assert taken.held and taken.current is not None and taken.current.holder == "b"
    assert not await store.release_lease("leader", "a")
    assert await store.release_lease("leader", "b")
    assert await store.get_lease("leader") is None


async def test_a_deposed_leaders_write_is_refused_by_the_lease_epoch(store: Store) -> None:
    """Fencing: the epoch rises when the lease changes hands, not on a renewal; a replica write carrying a
    holder and epoch the lease no longer has is refused (and writes nothing), the current holder's goes in."""
    a = (await store.acquire_lease("leader", "a", ttl=10.0, now=100.0)).current
    assert a is not None and a.epoch == 1
    renewed = (await store.acquire_lease("leader", "a", ttl=10.0, now=105.0)).current
    assert renewed is not None and renewed.epoch == 1
    a_fence = Fence("leader", "a", a.epoch)
    await store.upsert_replica(_replica("r1", "a's"), fence=a_fence)
    b = (
        await store.acquire_lease("leader", "b", ttl=10.0, now=116.0)
    ).current  # a's claim ran out: b takes it
    assert b is not None and b.holder == "b" and b.epoch == 2
    with pytest.raises(LeaseFenced, match="held by b at epoch 2, not by a at epoch 1"):
        await store.upsert_replica(_replica("r1", "deposed a's"), fence=a_fence)
    with pytest.raises(LeaseFenced):
        await store.delete_replica("r1", fence=a_fence)
    assert [r.state for r in await store.list_replicas()] == ["a's"]
    await store.upsert_replica(_replica("r1", "b's"), fence=Fence("leader", "b", 2))
    assert await store.delete_replica("r1", fence=Fence("leader", "b", 2))
    # A stale epoch is refused even for the same holder name, and a released lease fences everyone.
    with pytest.raises(LeaseFenced):
        await store.upsert_replica(_replica("r2", "x"), fence=Fence("leader", "b", 1))
    assert await store.release_lease("leader", "b")
    with pytest.raises(LeaseFenced, match="held by nobody"):
        await store.upsert_replica(_replica("r2", "x"), fence=Fence("leader", "b", 2))


def _replica(rid: str, state: str) -> ReplicaRecord:
    return ReplicaRecord(rid, "m", "p", ("n1",), state, "fp", 1.0, 1.0)


def test_parse_dsn() -> None:
    assert parse_dsn("sqlite:///rel/x.db").target == "rel/x.db"
    assert parse_dsn("sqlite:////abs/x.db").target == "/abs/x.db"
    assert parse_dsn("/abs/x.db").dialect == "sqlite"
    pg = parse_dsn("postgresql://u:secret@h:5/db")
    assert pg.dialect == "postgres" and "secret" not in pg.redacted()
    with pytest.raises(StoreError, match="unknown store DSN scheme"):
        parse_dsn("mysql://x")
    with pytest.raises(StoreError, match="empty"):
        parse_dsn("  ")


async def test_racing_takers_on_two_connections_never_exceed_the_limit(store: Store) -> None:
    """Two processes' worth of connections: the single-statement take is atomic on both databases."""
    other = await Store.open(store.dsn)
    try:
        calls = [s.take_share("p:rpm", 0.0, 60.0, 3, 100, now=1.0) for _ in range(30) for s in (store, other)]
        grants = await asyncio.gather(*calls)
    finally:
        await other.close()
    assert sum(g.granted for g in grants) == 100
    assert await store.counter_taken("p:rpm", 0.0) == 100


async def test_racing_lease_takers_one_wins(store: Store) -> None:
    other = await Store.open(store.dsn)
    try:
        results = await asyncio.gather(
            *(s.acquire_lease("leader", f"h{i}", 10.0, now=1.0) for i, s in enumerate([store, other] * 4))
        )
    finally:
        await other.close()
    winners = {r.current.holder for r in results if r.held and r.current}
    assert len(winners) == 1
    assert all(r.current is not None and r.current.holder in winners for r in results)


async def test_model_check_verdicts_are_kept_per_model_and_engine_version(store: Store) -> None:
    await store.save_model_check("m", "vllm", "0.10.1", '{"v": 1}', now=1.0)
    await store.save_model_check("m", "vllm", "0.10.1", '{"v": 2}', now=2.0)  # checked again: the newer one
    await store.save_model_check("m", "vllm", "0.11.0", '{"v": 3}', now=3.0)
    assert await store.list_model_checks() == ['{"v": 2}', '{"v": 3}']


async def test_usage_per_bucket_sums_every_row_of_each_hour(store: Store) -> None:
    """The console's chart reads these sums: every request of the window, not the newest thousand."""
    since = 36_000.0
    rows = [
        UsageRecord(
            time=since + t,
            request_id=f"r{i}",
            project=p,
            model="m",
            status=s,
            key_id=None,
            tokens_in=3,
            tokens_out=4,
            cost=0.5,
        )
        for i, (t, p, s) in enumerate(
            [(0.0, "a", 200), (3599.9, "a", 500), (3600.0, "a", 200), (7300.0, "b", 200), (-1.0, "a", 200)]
        )
    ]
    await store.insert_usage(rows)
    got = await store.usage_per_bucket(since, since + 3 * 3600, 3600.0)
    summed = [(b.bucket, b.project, b.requests, b.errors, b.tokens_in, b.tokens_out, b.cost) for b in got]
    # 3599.9 s is still the first hour (a rounding CAST would put it in the second); -1 s is before `since`.
    assert summed == [(0, "a", 2, 1, 6, 8, 1.0), (1, "a", 1, 0, 3, 4, 0.5), (2, "b", 1, 0, 3, 4, 0.5)]
    only_b = await store.usage_per_bucket(since, since + 3 * 3600, 3600.0, project="b")
    assert [(b.bucket, b.project) for b in only_b] == [(2, "b")]
    with pytest.raises(ValueError, match="bucket_s > 0"):
        await store.usage_per_bucket(since, since, 3600.0)
