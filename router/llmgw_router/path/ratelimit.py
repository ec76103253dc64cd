"""Tenant limits on the request path: the store's pooled limiter (llmgw.store.limits.limiter) behind one interface.

With a store, limits are pools shared by every router (each leases shares). With no store, the same limiter
runs against `MemoryCounters`, which grants this router the whole pool: one router, one pool. Budgets in
that mode count only what this router process has spent since it started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmgw.core.snapshot import PublishedModel, Tenants
from llmgw.core.tenancy.limits import (
    Estimate,
    Level,
    LevelLimits,
    LimitRefused,
    Tenant,
    level_limits,
    to_micros,
)
from llmgw.core.tenancy.projects import TenantChain
from llmgw.store.limits.limiter import CounterStore, PoolAdmission, PoolLimiter, SharePolicy
from llmgw.store.records import ShareGrant
from llmgw_router.server.errors import ApiError

__all__ = [
    "LimitGrant",
    "Limiter",
    "MemoryCounters",
    "NoLimits",
    "TenantLimiter",
    "budget_levels",
    "budget_use",
    "memory_limiter",
    "upfront_cost",
]


# Not frozen: built on every request, and a frozen dataclass costs about three times as much to construct
# (object.__setattr__ per field). Nothing mutates these after construction.
@dataclass(slots=True)
class LimitGrant:
    admission: PoolAdmission | None


class Limiter(Protocol):
    async def acquire(self, chain: TenantChain, tokens: int, cost: float) -> LimitGrant:
        """Let the request in (a LimitGrant) or raise a 429 ApiError naming the limit."""

    def end(self, lease: LimitGrant) -> None:
        """The answer's last bytes are about to go out: its concurrency slots go back now (once)."""

    def release(self, lease: LimitGrant, tokens_used: int, cost: float) -> None: ...

    def budget_spent(self, tenant: Tenant) -> int | None:
        """Micro-units of the tenant's budget spent in the current period; None when unknown."""


class NoLimits:
    async def acquire(self, chain: TenantChain, tokens: int, cost: float) -> LimitGrant:
        return LimitGrant(None)

    def end(self, lease: LimitGrant) -> None:
        return None

    def release(self, lease: LimitGrant, tokens_used: int, cost: float) -> None:
        return None

    def budget_spent(self, tenant: Tenant) -> int | None:
        return None


class TenantLimiter:
    def __init__(self, pool: PoolLimiter) -> None:
        self._pool = pool
        # By id of the chain (the routing table hands out one chain object per project and revision), so
        # the hot path does not hash the chain's limits on every request. Entry: (chain, tenants, limited).
        self._tenants: dict[int, tuple[TenantChain, tuple[Tenant, ...], bool]] = {}

    async def acquire(self, chain: TenantChain, tokens: int, cost: float) -> LimitGrant:
        found = self._tenants.get(id(chain))
        if found is None or found[0] is not chain:  # the entry holds the chain, so its id is not reused
            if len(self._tenants) > 10_000:
                self._tenants.clear()
            tenants = chain.levels
            found = self._tenants[id(chain)] = (
                chain,
                tenants,
                any(t.limits != LevelLimits() for t in tenants),
            )
        _chain, tenants, limited = found
        if not limited:
            return LimitGrant(None)
        got = await self._pool.admit(tenants, Estimate(tokens, cost))
        if isinstance(got, LimitRefused):
            # One Retry-After: the decision's headers already carry it (a second, differently cased key
            # would go out as a second header line, read by clients as "60, 60").
            headers = {k: v for k, v in got.headers.items() if k.lower() != "retry-after"}
            headers["Retry-After"] = str(got.retry_after)
            raise ApiError(429, got.message, "rate_limit_exceeded", type_="rate_limit_error", headers=headers)
        return LimitGrant(got)

    def end(self, lease: LimitGrant) -> None:
        if lease.admission is not None:
            self._pool.end(lease.admission)

    def release(self, lease: LimitGrant, tokens_used: int, cost: float) -> None:
        if lease.admission is not None:
            self._pool.finish(lease.admission, tokens_used, cost)

    def budget_spent(self, tenant: Tenant) -> int | None:
        return self._pool.budget_spent(tenant)


def budget_levels(tenants: Tenants) -> list[Tenant]:
    """Every organization, team and project of the snapshot that declares a budget, as limiter tenants."""
    levels: list[tuple[Level, Mapping[str, Any]]] = [
        ("organization", tenants.organizations),
        ("team", tenants.teams),
        ("project", tenants.projects),
    ]
    return [
        Tenant(level, name, level_limits(spec.limits))
        for level, specs in levels
        for name, spec in specs.items()
        if spec.limits.budget is not None
    ]


def budget_use(limiter: Limiter, tenants: Tenants) -> list[tuple[str, str, float]]:
    """(level, name, spent / amount) for every level with a budget whose spend this router knows; a level
    whose spend is unknown (no request of it seen in this period) is left out rather than shown as 0."""
    out: list[tuple[str, str, float]] = []
    for tenant in budget_levels(tenants):
        spent = limiter.budget_spent(tenant)
        if spent is None:
            continue
        amount = to_micros(tenant.limits.budget.amount) if tenant.limits.budget else 0
        # A zero budget refuses everything: nothing is spent, so it is as used up as a budget can be.
        out.append((tenant.level, tenant.name, spent / amount if amount else 1.0))
    return out


class MemoryCounters(CounterStore):
    """The limiter's counter store for a router with no store: windows kept in memory, one router's pool."""

    def __init__(self) -> None:
        self._taken: dict[tuple[str, float], int] = {}

    async def take_share(
        self, limit_key: str, window_start: float, window_end: float, want: int, limit: int, now: float
    ) -> ShareGrant:
        key = (limit_key, window_start)
        if len(self._taken) > 100_000:  # old windows: drop them all, current ones are re-taken on demand
            self._taken = {k: v for k, v in self._taken.items() if k[1] >= window_start}
        taken = self._taken.get(key, 0)
        granted = max(0, min(want, limit - taken))
        self._taken[key] = taken + granted
        return ShareGrant(granted, taken + granted)

    async def seed_counter(
        self, limit_key: str, window_start: float, window_end: float, taken: int, now: float
    ) -> bool:
        key = (limit_key, window_start)
        if key in self._taken:
            return False
        self._taken[key] = taken
        return True

    async def spend(self, level: str, name: str, since: float, until: float | None = None) -> float:
        return 0.0


def memory_limiter(clock: Callable[[], float]) -> TenantLimiter:
    # The whole pool in one share: nobody else takes from it.
    return TenantLimiter(
        PoolLimiter(MemoryCounters(), clock=clock, policy=SharePolicy(fraction=1.0, budget_fraction=1.0))
    )


def upfront_cost(models: Sequence[PublishedModel], tokens: int) -> float:
    """What a request is charged against budgets before it is served: its tokens at the dearest price of any
    model that may serve it (a fallback may cost more than the model asked for), corrected when it ends."""
    return tokens * max(max(m.prices.input_per_million, m.prices.output_per_million) for m in models) / 1e6
