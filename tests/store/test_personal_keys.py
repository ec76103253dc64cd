"""Personal keys and who spent what, on both stores (issue 44, migration 0023): a key owned by a person, with
or without a project, comes back with its owner; usage rows keep the person and group by them; a store from
before the migration keeps its keys as project keys and its usage as nobody's."""

from __future__ import annotations

import math

import pytest

from llmgw.adapters import keys
from llmgw.core.config.models import PersonLimits
from llmgw.core.tenancy.limits import Budget, Estimate, LevelLimits, Tenant
from llmgw.core.tenancy.people import member_level
from llmgw.store import Store, StoreError, UsageRecord
from llmgw.store.limits.limiter import PoolAdmission, PoolLimiter, SharePolicy
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
        UsageRecord(
            time=10.0,
            request_id="a",
            project="evals",
            model="m",
            status=200,
            key_id=alice.key.id,
            person="alice",
            tokens_in=3,
            tokens_out=4,
        ),
        UsageRecord(
            time=11.0,
            request_id="b",
            project="evals",
            model="m",
            status=429,
            key_id=alice.key.id,
            person="alice",
        ),
        UsageRecord(time=12.0, request_id="c", project="evals", model="m", status=200, tokens_in=1),
    ]
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


async def test_a_persons_and_a_members_budget_count_what_they_spent_before(store: Store) -> None:
    """Budgets of people are seeded from usage as the tenants' are: a person's across every project, a
    member's share within its scope only."""
    period = 30 * 86400.0
    now = math.floor(1_200_000.0 / period) * period + 10
    await store.insert_usage(
        [
            UsageRecord(
                time=now - 5, request_id="a", project="evals", model="m", status=200, person="alice", cost=0.6
            ),
            UsageRecord(
                time=now - 4, request_id="b", project="other", model="m", status=200, person="alice", cost=0.3
            ),
            UsageRecord(
                time=now - 3, request_id="c", project="evals", model="m", status=200, person="bob", cost=5.0
            ),
            UsageRecord(time=now - 2, request_id="d", project="evals", model="m", status=200, cost=5.0),
        ]
    )
    assert await store.spend("person", "alice", now - period) == pytest.approx(0.9)
    assert await store.spend("member", "alice@project/evals", now - period) == pytest.approx(0.6)
    with pytest.raises(StoreError, match="PERSON@KIND/SCOPE"):
        await store.spend("member", "alice", now - period)
    share = PersonLimits.model_validate({"budget": {"amount": 1.0, "period": "30d"}})
    chains = {
        "person": (
            Tenant("project", "evals"),
            Tenant("person", "alice", LevelLimits(budget=Budget(1.0, period))),
        ),
        "member": (Tenant("project", "evals"), member_level("alice", "project", "evals", share)),
    }
    for level, chain in chains.items():
        limiter = PoolLimiter(store, clock=lambda: now, policy=SharePolicy(budget_fraction=0.01))
        served = 0
        while isinstance(
            decision := await limiter.admit(chain, Estimate(tokens=1, cost=0.01)), PoolAdmission
        ):
            limiter.finish(decision, tokens=1, cost=0.01)
            served += 1
        assert (decision.level, decision.metric) == (level, "budget")
        assert served == {"person": 10, "member": 40}[level]  # 1.0 less 0.9 spent, or less 0.6
