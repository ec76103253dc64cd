"""Limits that hold across several routers: each router spends shares of every pooled limit it leases
from the store, and renews through the store when a share runs out.

One row per (limit, window) in the store; `take_share` grants "up to n" of what is left in one atomic
statement, so all routers together are never granted more than the limit. A router admits a request only
against units it was granted, so with the store reachable the pool is never exceeded (margin 0 for rpm).

Outage rule: when the store cannot be reached, a router keeps serving on the share it holds; when that
runs out it may take ONE grace share per limit per window on its own authority, then refuses. So during an
outage a pool can be exceeded by at most one grace share per router per window, and never more.
Tokens and budget are charged on an estimate at admission and corrected when the request finishes
(`finish`): an overrun becomes debt, paid from the next share before anything else is admitted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.limits import (
    MICROS,
    Allowed,
    Estimate,
    LevelState,
    Meter,
    Metric,
    Refused,
    Tenant,
    decide,
    limit_key,
    need,
    window_bounds,
    windowed_limits,
)
from llmgw.store.db import StoreUnavailable
from llmgw.store.records import ShareGrant

log = logging.getLogger(__name__)


class CounterStore(Protocol):
    """The part of the store the limiter uses (the real Store, or a faithful fake in unit tests)."""

    async def take_share(
        self, limit_key: str, window_start: float, window_end: float, want: int, limit: int, now: float
    ) -> ShareGrant: ...

    async def seed_counter(
        self, limit_key: str, window_start: float, window_end: float, taken: int, now: float
    ) -> bool: ...

    async def spend(self, level: str, name: str, since: float, until: float | None = None) -> float: ...


@dataclass(frozen=True)
class SharePolicy:
    """How big a share is: a fraction of the limit, at least `min_units`. Smaller shares waste less when a
    router stops holding one (unused units are lost for the window) but cost more store round trips."""

    fraction: float = 0.1
    budget_fraction: float = 0.01  # a budget period is long: a router restart forfeits at most 1% of it
    min_units: int = 1
    grace: bool = True  # the outage rule: one extra share per limit per window while the store is away

    def size(self, metric: Metric, limit: int) -> int:
        frac = self.budget_fraction if metric == "budget" else self.fraction
        return max(self.min_units, math.ceil(limit * frac))


@dataclass
class _Share:
    """What this router holds of one pooled limit in its current window."""

    window_start: float
    window_end: float
    limit: int
    balance: int = 0  # granted to us and not yet spent; negative is debt from an overrun
    taken: int = 0  # the pool's total taken, as of our last renewal
    grace_used: bool = False
    seeded: bool = False
    answered: bool = False  # the store has answered in this window, so `taken` is its word


@dataclass(frozen=True)
class Admission:
    """A request let in: hand it back to `finish` when the request ends (whatever its outcome)."""

    chain: tuple[Tenant, ...]
    estimate: Estimate
    headers: dict[str, str]
    charged: dict[str, float] = field(default_factory=dict)  # share key -> window_start it was charged in


class Limiter:
    """Per-router admission against pooled limits. One per router process; async-safe (one lock).

    `admit` is the entry point: it renews shares through the store only when one runs short, so most
    requests cost no store round trip.
    """

    def __init__(
        self,
        store: CounterStore,
        clock: Callable[[], float] = time.time,
        policy: SharePolicy | None = None,
        store_timeout: float = 2.0,
        retry_interval: float = 1.0,
    ) -> None:
        self._store = store
        self._clock = clock
        self._policy = policy or SharePolicy()
        self._timeout = store_timeout
        self._retry_interval = retry_interval
        self._shares: dict[str, _Share] = {}
        self._inflight: dict[str, int] = {}
        self._store_down_until = -math.inf
        self._lock = asyncio.Lock()

    @property
    def store_reachable(self) -> bool:
        return self._clock() >= self._store_down_until

    async def admit(self, chain: Sequence[Tenant], estimate: Estimate) -> Admission | Refused:
        """Let a request in, or refuse it naming the level and limit. Charges every level of the chain."""
        chain = tuple(chain)
        async with self._lock:
            now = self._clock()
            for tenant in chain:
                for metric, limit, length in windowed_limits(tenant):
                    share = self._share(limit_key(tenant, metric), limit, length, now)
                    wanted = need(metric, estimate)
                    if share.balance < wanted:
                        await self._renew(tenant, metric, share, math.ceil(wanted), now)
            states = [self._state(tenant, now) for tenant in chain]
            decision = decide(states, estimate, now)
            if isinstance(decision, Refused):
                return decision
            return self._charge(chain, estimate, decision, now)

    def finish(self, admission: Admission, tokens: int, cost: float) -> None:
        """The request ended: release its concurrency and correct the token and budget estimates."""
        for tenant in admission.chain:
            if tenant.limits.concurrency is not None:
                self._inflight[tenant.key] = max(0, self._inflight.get(tenant.key, 0) - 1)
            for metric, actual in (("tokens", tokens), ("budget", math.ceil(cost * MICROS))):
                key = limit_key(tenant, metric)  # type: ignore[arg-type]
                share = self._shares.get(key)
                if share is None or admission.charged.get(key) != share.window_start:
                    continue  # the window it was charged in is over: nothing left to correct
                estimated = need(metric, admission.estimate)  # type: ignore[arg-type]
                share.balance -= int(actual - estimated)

    def _share(self, key: str, limit: int, length: float, now: float) -> _Share:
        start, end = window_bounds(now, length)
        share = self._shares.get(key)
        if share is None or share.window_start != start:
            share = _Share(start, end, limit)  # a new window: last window's balance and debt are gone
            self._shares[key] = share
        share.limit = limit  # a limit changed by a new revision applies at once
        return share

    async def _renew(self, tenant: Tenant, metric: Metric, share: _Share, wanted: int, now: float) -> None:
        key = limit_key(tenant, metric)
        size = self._policy.size(metric, share.limit)
        want = max(wanted - share.balance, size)
        if share.answered and share.taken >= share.limit:
            return  # the pool is empty until the window ends (nobody gives units back): do not ask again
        if now >= self._store_down_until:
            try:
                if metric == "budget" and not share.seeded:
                    await self._seed_budget(tenant, key, share, now)
                async with asyncio.timeout(self._timeout):
                    grant = await self._store.take_share(
                        key, share.window_start, share.window_end, want, share.limit, now
                    )
            except (StoreUnavailable, TimeoutError) as exc:
                self._store_down_until = now + self._retry_interval
                log.warning("limit store unreachable, serving on held shares: %s", exc)
            else:
                share.balance += grant.granted
                share.taken = grant.taken
                share.answered = True
                return
        if self._policy.grace and not share.grace_used:
            share.grace_used = True
            share.balance += size

    async def _seed_budget(self, tenant: Tenant, key: str, share: _Share, now: float) -> None:
        """A budget window's first row starts at what usage says was spent in it, so spend recorded before
        the row existed (or before a store move) counts."""
        async with asyncio.timeout(self._timeout):
            spent = await self._store.spend(tenant.level, tenant.name, share.window_start, share.window_end)
            taken = math.ceil(spent * MICROS)
            await self._store.seed_counter(key, share.window_start, share.window_end, taken, now)
        share.seeded = True

    def _state(self, tenant: Tenant, now: float) -> LevelState:
        meters: dict[Metric, Meter] = {}
        for metric, limit, _length in windowed_limits(tenant):
            share = self._shares[limit_key(tenant, metric)]
            left = max(0, share.limit - share.taken) + share.balance
            meters[metric] = Meter(limit, share.balance, share.window_end, left)
        if tenant.limits.concurrency is not None:
            used = self._inflight.get(tenant.key, 0)
            meters["concurrency"] = Meter(tenant.limits.concurrency, tenant.limits.concurrency - used, None)
        return LevelState(tenant, meters)

    def _charge(
        self, chain: tuple[Tenant, ...], estimate: Estimate, allowed: Allowed, now: float
    ) -> Admission:
        charged: dict[str, float] = {}
        for tenant in chain:
            for metric, _limit, _length in windowed_limits(tenant):
                key = limit_key(tenant, metric)
                share = self._shares[key]
                share.balance -= math.ceil(need(metric, estimate))
                charged[key] = share.window_start
            if tenant.limits.concurrency is not None:
                self._inflight[tenant.key] = self._inflight.get(tenant.key, 0) + 1
        return Admission(chain, estimate, allowed.headers, charged)
