"""Pooled limits across routers: shares taken from the store, the stated margin, the outage rule."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings, strategies as st

from llmgw.core.tenancy.limits import Budget, Estimate, LevelLimits, LimitRefused, Tenant
from llmgw.store import Store, UsageRecord
from llmgw.store.limits.limiter import PoolAdmission, PoolLimiter, SharePolicy

from .fakes import FakeStore

T0 = 1_200_000.0  # the start of a minute window


def chain(
    rpm: int | None = None,
    tpm: int | None = None,
    concurrency: int | None = None,
    budget: float | None = None,
) -> tuple[Tenant, ...]:
    org = Tenant(
        "organization", "acme", LevelLimits(budget=Budget(budget, 30 * 86400) if budget is not None else None)
    )
    return (
        org,
        Tenant("team", "research"),
        Tenant("project", "playground", LevelLimits(rpm=rpm, tpm=tpm, concurrency=concurrency)),
    )


async def admit_many(limiters: list[PoolLimiter], tenants: tuple[Tenant, ...], n: int, est: Estimate) -> int:
    results = await asyncio.gather(*(limiters[i % len(limiters)].admit(tenants, est) for i in range(n)))
    return sum(isinstance(r, PoolAdmission) for r in results)


async def test_two_routers_never_exceed_the_pool_while_the_store_answers() -> None:
    fake = FakeStore()
    routers = [PoolLimiter(fake, clock=lambda: T0 + 5), PoolLimiter(fake, clock=lambda: T0 + 5)]
    admitted = await admit_many(routers, chain(rpm=50), 200, Estimate(tokens=1))
    assert admitted == 50
    refused = await routers[0].admit(chain(rpm=50), Estimate(tokens=1))
    assert isinstance(refused, LimitRefused) and (refused.level, refused.metric) == ("project", "requests")
    assert refused.retry_after == 55
    assert fake.calls <= 50 // 5 + 4  # shares of 10%: a store round trip per share, not per request


async def test_outage_serves_held_share_then_one_grace_share_then_refuses() -> None:
    fake = FakeStore()
    now = [T0]
    router = PoolLimiter(fake, clock=lambda: now[0], policy=SharePolicy(fraction=0.1), retry_interval=1.0)
    tenants = chain(rpm=100)
    assert isinstance(await router.admit(tenants, Estimate(1)), PoolAdmission)  # holds a share of 10, spent 1
    fake.down = True
    served = sum([isinstance(await router.admit(tenants, Estimate(1)), PoolAdmission) for _ in range(50)])
    assert served == 9 + 10  # the rest of the held share, then one grace share
    assert isinstance(await router.admit(tenants, Estimate(1)), LimitRefused)
    fake.down = False
    now[0] += 1.5  # past the retry interval: the store is asked again
    assert isinstance(await router.admit(tenants, Estimate(1)), PoolAdmission)
    assert fake.counters[("project:playground:requests", T0)] == 20


async def test_a_new_window_starts_a_fresh_pool() -> None:
    fake = FakeStore()
    now = [T0 + 59]
    router = PoolLimiter(fake, clock=lambda: now[0])
    assert await admit_many([router], chain(rpm=3), 5, Estimate(1)) == 3
    now[0] = T0 + 60
    assert await admit_many([router], chain(rpm=3), 5, Estimate(1)) == 3


async def test_token_overrun_becomes_debt_and_concurrency_is_released() -> None:
    fake = FakeStore()
    router = PoolLimiter(fake, clock=lambda: T0)
    tenants = chain(tpm=1000, concurrency=1)
    first = await router.admit(tenants, Estimate(tokens=100))
    assert isinstance(first, PoolAdmission)
    busy = await router.admit(tenants, Estimate(tokens=100))
    assert isinstance(busy, LimitRefused) and busy.metric == "concurrency"
    router.finish(first, tokens=950, cost=0.0)  # used far more than estimated
    second = await router.admit(tenants, Estimate(tokens=100))
    assert isinstance(second, LimitRefused) and second.metric == "tokens"  # 950 + 100 > 1000


@settings(max_examples=60, deadline=None)
@given(
    routers=st.integers(1, 4),
    limit=st.integers(1, 300),
    fraction=st.sampled_from([0.01, 0.1, 0.25, 1.0]),
    waves=st.lists(st.tuples(st.integers(0, 80), st.booleans()), min_size=1, max_size=8),
)
def test_shares_never_let_concurrent_takers_exceed_limit_plus_margin(
    routers: int, limit: int, fraction: float, waves: list[tuple[int, bool]]
) -> None:
    """Stated margin: 0 while the store answers; one grace share per router per window once it has not."""
    policy = SharePolicy(fraction=fraction)
    share = policy.size("requests", limit)

    async def run() -> tuple[int, bool]:
        fake = FakeStore()
        # retry_interval 0: every wave asks the store again, the worst case for double grants
        limiters = [
            PoolLimiter(fake, clock=lambda: T0, policy=policy, retry_interval=0.0) for _ in range(routers)
        ]
        total, outage = 0, False
        for size, down in waves:
            fake.down = down
            outage |= down
            total += await admit_many(limiters, chain(rpm=limit), size, Estimate(1))
        return total, outage

    admitted, outage = asyncio.run(run())
    margin = routers * share if outage else 0
    assert admitted <= limit + margin
    demand = sum(size for size, _ in waves)
    if not outage and routers == 1:
        assert admitted == min(demand, limit)  # one router wastes nothing


async def test_two_routers_on_the_real_store(store: Store) -> None:
    """The two-router test: each router has its own connection; rpm 30 lets 30 through both together."""
    second = await Store.open(store.dsn)
    try:
        routers = [PoolLimiter(store, clock=lambda: T0 + 1), PoolLimiter(second, clock=lambda: T0 + 1)]
        assert await admit_many(routers, chain(rpm=30), 80, Estimate(1)) == 30
    finally:
        await second.close()
    assert await store.counter_taken("project:playground:requests", T0) == 30


async def test_budget_survives_a_router_restart_and_counts_recorded_usage(store: Store) -> None:
    now = T0 + 10
    period_start = math.floor(now / (30 * 86400)) * (30 * 86400)
    # Spend recorded before any router ran (for instance before a store move) counts against the budget.
    await store.insert_usage(
        [
            UsageRecord(
                time=period_start + 1,
                request_id="old",
                project="playground",
                org="acme",
                model="m",
                status=200,
                cost=0.9,
            )
        ]
    )
    tenants = chain(budget=1.0)
    router = PoolLimiter(store, clock=lambda: now, policy=SharePolicy(budget_fraction=0.01))
    est = Estimate(tokens=10, cost=0.01)
    served = 0
    for _ in range(20):
        decision = await router.admit(tenants, est)
        if isinstance(decision, LimitRefused):
            assert (decision.level, decision.metric) == ("organization", "budget")
            break
        router.finish(decision, tokens=10, cost=0.01)
        served += 1
    assert served == 10  # 0.9 spent + 10 x 0.01 = the budget of 1.0
    restarted = PoolLimiter(store, clock=lambda: now)
    again = await restarted.admit(tenants, est)
    assert isinstance(again, LimitRefused) and again.metric == "budget"


@pytest.mark.postgres
async def test_outage_rule_when_postgresql_really_stops(pg_server, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    if not pg_server.controllable:
        pytest.skip("an external PostgreSQL (LLMGW_TEST_PG_DSN) is not ours to stop")
    store = await Store.open(pg_dsn)
    now = [T0]
    router = PoolLimiter(store, clock=lambda: now[0], policy=SharePolicy(fraction=0.1), retry_interval=1.0)
    tenants = chain(rpm=100)
    try:
        assert isinstance(await router.admit(tenants, Estimate(1)), PoolAdmission)  # holds 10, spent 1
        await asyncio.to_thread(pg_server.stop)
        try:
            served = [isinstance(await router.admit(tenants, Estimate(1)), PoolAdmission) for _ in range(30)]
        finally:
            await asyncio.to_thread(pg_server.start)
        assert sum(served) == 9 + 10  # the held share, then one grace share, then refusals
        now[0] += 2  # past the retry interval: the store answers again and the pool continues
        assert isinstance(await router.admit(tenants, Estimate(1)), PoolAdmission)
        assert await store.counter_taken("project:playground:requests", T0) == 20
    finally:
        await store.close()
