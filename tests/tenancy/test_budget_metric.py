"""llmgw_router_budget_used_ratio: a router's view of each budget's use, as its limiter knows it.

The Router runs in process over the no-store limiter (the whole pool in one share), with a fixed clock, so
the spend it counts is exactly what the test charged; the gauge is read from the router's own registry.
"""

from __future__ import annotations

from typing import Any

import pytest
from llmgw_router.path.ratelimit import MemoryCounters, TenantLimiter, memory_limiter
from llmgw_router.path.service import Router

from llmgw.core.snapshot import RouterSnapshot
from llmgw.core.tenancy.limits import Budget, LevelLimits, Tenant
from llmgw.store.db import StoreUnavailable
from llmgw.store.limits.limiter import PoolLimiter, SharePolicy

NOW = 1_000_000.0
RATIO = "llmgw_router_budget_used_ratio"


def _snapshot(revision: str, org: dict[str, Any], project: dict[str, Any]) -> RouterSnapshot:
    return RouterSnapshot.model_validate(
        {
            "revision": revision,
            "tenants": {
                "organizations": {"acme": org},
                "teams": {"research": {"organization": "acme"}},  # no budget: never a series
                "projects": {"p": {"team": "research", **project}, "free": {"team": "research"}},
            },
        }
    )


def _budget(amount: float, period: str = "30d") -> dict[str, Any]:
    return {"limits": {"budget": {"amount": amount, "period": period}}}


def _ratio(router: Router, level: str, tenant: str) -> float | None:
    return router.metrics.registry.get_sample_value(RATIO, {"level": level, "tenant": tenant})


def _series(router: Router) -> set[tuple[str, str]]:
    return {
        (sample.labels["level"], sample.labels["tenant"])
        for family in router.metrics.registry.collect()
        if family.name == RATIO
        for sample in family.samples
    }


async def _spend(router: Router, project: str, estimate: float, cost: float) -> None:
    assert router.table is not None
    chain = router.table.chain(project)
    assert chain is not None
    lease = await router.limiter.acquire(chain, 10, estimate)
    router.limiter.release(lease, 10, cost)


async def test_the_gauge_rises_with_spend_and_follows_the_snapshot() -> None:
    router = Router(limiter=memory_limiter(lambda: NOW), clock=lambda: NOW)
    router.apply_snapshot(_snapshot("r1", _budget(100), _budget(10, "1h")))
    # Nothing charged yet in this period: the spend is unknown to this router, so no series (not 0).
    assert _series(router) == set()

    assert router.table is not None
    chain = router.table.chain("p")
    assert chain is not None
    lease = await router.limiter.acquire(chain, 10, 2.0)
    # Admitted: charged its estimate at every level with a budget.
    assert _ratio(router, "project", "p") == pytest.approx(0.2)
    assert _ratio(router, "organization", "acme") == pytest.approx(0.02)
    router.limiter.release(lease, 10, 1.0)
    # Finished: corrected to what it really cost.
    assert _ratio(router, "project", "p") == pytest.approx(0.1)
    assert _ratio(router, "organization", "acme") == pytest.approx(0.01)

    await _spend(router, "p", 4.0, 3.0)
    assert _ratio(router, "project", "p") == pytest.approx(0.4)
    await _spend(router, "free", 5.0, 5.0)  # the project has no budget; its organization's pool still counts
    assert _ratio(router, "organization", "acme") == pytest.approx(0.09)
    assert _series(router) == {("project", "p"), ("organization", "acme")}  # only levels with a budget

    # A new revision: the organization's budget halves (the ratio doubles at once, before any request), the
    # project's budget is gone (so is its series).
    router.apply_snapshot(_snapshot("r2", _budget(50), {}))
    assert _ratio(router, "organization", "acme") == pytest.approx(0.18)
    assert _series(router) == {("organization", "acme")}


async def test_an_overrun_reads_above_one_and_a_new_period_is_unknown() -> None:
    clock = [NOW]
    router = Router(limiter=memory_limiter(lambda: clock[0]), clock=lambda: clock[0])
    router.apply_snapshot(_snapshot("r1", {}, _budget(10, "1h")))
    await _spend(router, "p", 1.0, 12.0)  # estimated low, cost more than the whole budget
    assert _ratio(router, "project", "p") == pytest.approx(1.2)
    clock[0] += 3600  # the next period: nothing learnt about it yet
    assert _ratio(router, "project", "p") is None


class _DownStore(MemoryCounters):
    async def take_share(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("down for the test")


async def test_spend_on_a_grace_share_is_not_the_stores_word() -> None:
    # The store never answered: the router serves on its grace share, but it does not know the pool's spend.
    pool = PoolLimiter(_DownStore(), clock=lambda: NOW, policy=SharePolicy(budget_fraction=0.5))
    limiter = TenantLimiter(pool)
    tenant = Tenant("project", "p", LevelLimits(budget=Budget(10, 3600)))
    router = Router(limiter=limiter, clock=lambda: NOW)
    router.apply_snapshot(_snapshot("r1", {}, _budget(10, "1h")))
    await _spend(router, "p", 1.0, 1.0)
    assert limiter.budget_spent(tenant) is None
    assert _ratio(router, "project", "p") is None
