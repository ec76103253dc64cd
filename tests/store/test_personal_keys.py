"""Personal keys and who spent what, on both stores (issue 44, migration 0023): a key owned by a person, with
or without a project, comes back with its owner; usage rows keep the person and group by them; a store from
before the migration keeps its keys as project keys and its usage as nobody's."""

from __future__ import annotations

import pytest

from llmgw.adapters import keys
from llmgw.store import Store, StoreError, UsageRecord
from llmgw.store.migrate import load_migrations, migrate


async def test_a_personal_key_keeps_its_owner_and_may_have_no_project(store: Store) -> None:
    project_key = await keys.create_key(store, "evals", now=1000.0, name="ci")
    own = await keys.create_key(store, None, now=1000.0, owner="alice")
    scoped = await keys.create_key(store, "evals", now=1000.0, owner="alice")
    found = await keys.lookup(store, own.plaintext, now=1001.0)
    assert found is not None and (found.project, found.owner, found.state) == (None, "alice", "active")
    found = await keys.lookup(store, scoped.plaintext, now=1001.0)
    assert found is not None and (found.project, found.owner) == ("evals", "alice")
    found = await keys.lookup(store, project_key.plaintext, now=1001.0)
    assert found is not None and (found.project, found.owner) == ("evals", None)
    assert {k.id for k in await store.list_keys(owner="alice")} == {own.key.id, scoped.key.id}
    assert {k.id for k in await store.list_keys("evals")} == {project_key.key.id, scoped.key.id}
    assert [k.id for k in await store.list_keys("evals", "alice")] == [scoped.key.id]
    assert (await store.get_key(own.key.id)) == own.key
    with pytest.raises(StoreError, match="a project, or an owner"):
        await keys.create_key(store, None, now=1000.0)


async def test_usage_records_who_spent_it_and_groups_by_person(store: Store) -> None:
    alice = await keys.create_key(store, "evals", now=1.0, owner="alice")
    rows = [
        UsageRecord(time=10.0, request_id="a", project="evals", model="m", status=200, key_id=alice.key.id,
                    person="alice", tokens_in=3, tokens_out=4),
        UsageRecord(time=11.0, request_id="b", project="evals", model="m", status=429, key_id=alice.key.id,
                    person="alice"),
        UsageRecord(time=12.0, request_id="c", project="evals", model="m", status=200, tokens_in=1),
    ]  # fmt: skip
    await store.insert_usage(rows)
    totals = {t.group: t for t in await store.usage_totals("person")}
    assert set(totals) == {"alice", ""}  # "": requests of nobody's own key
    assert (totals["alice"].requests, totals["alice"].errors, totals["alice"].tokens_in) == (2, 1, 3)
    assert totals[""].requests == 1
    assert [r.person for r in await store.usage_by_request("a")] == ["alice"]
    assert [r.person for r in await store.usage_by_request("c")] == [None]


async def test_keys_and_usage_from_before_the_migration_are_nobodys(store_dsn: str) -> None:
    before = [m for m in load_migrations() if m.version < 23]
    opened = await Store.open(store_dsn, migrate_schema=False)
    try:
        await migrate(opened.db, before)
        async with opened.db.tx() as tx:
            await tx.execute(
                "INSERT INTO api_keys (id, prefix, project, name, created_at, hash) "
                "VALUES ('k1', 'sk-llmgw-abcd', 'p', '', 1.0, 'h1')"
            )
            await tx.execute(
                "INSERT INTO usage (id, time, request_id, project, key_id, model, status) "
                "VALUES ('u1', 5.0, 'r1', 'p', 'k1', 'm', 200)"
            )
        assert 23 in await migrate(opened.db)
        (key,) = await opened.list_keys()
        assert (key.project, key.owner) == ("p", None)
        assert [(t.group, t.requests) for t in await opened.usage_totals("person")] == [("", 1)]
    finally:
        await opened.close()
