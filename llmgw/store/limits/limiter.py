"""Limits that hold across several routers: each router spends shares of every pooled limit it leases
from the store, and renews through the store when a share runs out.

One row per (limit, window) in the store; `take_share` grants "up to n" of what is left in one atomic
statement, so all routers together are never granted more than the limit. A router admits a request only
against units it was granted, so with the store reachable the pool is never exceeded (margin 0 for rpm).

Outage rule: when the store cannot be reached, a router keeps serving on the share it holds; when that
runs out it may take ONE grace share per limit per window on its own authority, then refuses. So during an
outage a pool can be exceeded by at most one grace share per router per window, and never more. With a
`GraceLedger` that holds across restarts of the router (a restarted process does not take another).
Concurrency is not a window but a level: its slots are held per router process through the store and come
back when requests end (`llmgw.store.limits.slots`, with its own outage rule); without a store, counted here.
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

from llmgw.core.tenancy.limits import (
    MICROS,
    RATE_HEADER_METRICS,
    Allowed,
    Estimate,
    LevelState,
    LimitRefused,
    Meter,
    Metric,
    Tenant,
    decide,
    limit_key,
    need,
    put_rate_headers,
    to_micros,
    window_bounds,
    windowed_limits,
)
from llmgw.store.errors import StoreUnavailable, unreachable_words
from llmgw.store.limits.grace_ledger import GraceLedger
from llmgw.store.limits.slots import LocalSlots, Slots
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
class _Pool:
    """One pooled limit of one level: its store key, what it counts, its size and window length."""

    key: str
    metric: Metric
    limit: int
    length: float


@dataclass(frozen=True)
class _Plan:
    """What admitting a request of one chain touches, worked out once per chain instead of per request (the
    keys, limits and windows of every level were recomputed several times on each request's hot path)."""

    chain: tuple[Tenant, ...]
    pools: tuple[tuple[Tenant, tuple[_Pool, ...]], ...]  # per level, in chain order
    corrected: tuple[_Pool, ...]  # tokens and budget pools: charged on the estimate, corrected by `finish`
    capped: tuple[tuple[str, int], ...]  # (limit key, cap) of the levels with a concurrency limit

    @classmethod
    def of(cls, chain: tuple[Tenant, ...]) -> _Plan:
        pools = tuple(
            (t, tuple(_Pool(limit_key(t, m), m, limit, length) for m, limit, length in windowed_limits(t)))
            for t in chain
        )
        corrected = tuple(p for _, ps in pools for p in ps if p.metric in ("tokens", "budget"))
        capped = tuple(
            (limit_key(t, "concurrency"), t.limits.concurrency)
            for t in chain
            if t.limits.concurrency is not None
        )
        return cls(chain, pools, corrected, capped)


def _needs(estimate: Estimate) -> dict[Metric, float]:
    """What the request takes from each counted limit (as `need` says), once per request."""
    return {"requests": 1, "tokens": estimate.tokens, "budget": estimate.cost_micros}


# Not frozen: built on every request, and a frozen dataclass costs about three times as much to construct
# (object.__setattr__ per field). Nothing mutates these after construction.
@dataclass(slots=True)
class PoolAdmission:
    """A request let in: hand it to `end` as its answer's last bytes go out, and to `finish` when the request
    ends (whatever its outcome)."""

    chain: tuple[Tenant, ...]
    estimate: Estimate
    headers: dict[str, str]
    charged: dict[str, float] = field(default_factory=dict)  # share key -> window_start it was charged in
    ended: bool = False  # its concurrency slots are given back (`end`)


class PoolLimiter:
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
        grace_ledger: GraceLedger | None = None,
        slots: Slots | None = None,
        slot_wait: float = 1.0,
    ) -> None:
        self._store = store
        self._clock = clock
        self._policy = policy or SharePolicy()
        self._timeout = store_timeout
        self._retry_interval = retry_interval
        self._grace_ledger = grace_ledger  # grace shares taken, kept across restarts (None: memory only)
        self._shares: dict[str, _Share] = {}
        self._plans: dict[int, _Plan] = {}  # by id of the chain: callers pass the same tuple for a project
        # Requests in flight per capped level: this process's own count, or slots pooled through the store
        # (llmgw.store.limits.slots.PooledSlots) so that every router process together keeps a level's limit.
        self._slots: Slots = slots if slots is not None else LocalSlots()
        self._slot_wait = slot_wait  # the longest a request waits for a slot another process gives back
        self._store_down_until = -math.inf
        self._lock = asyncio.Lock()  # one renewal at a time
        self._unlocked = asyncio.Event()  # set whenever no renewal is under way
        self._unlocked.set()

    @property
    def store_reachable(self) -> bool:
        return self._clock() >= self._store_down_until

    def budget_spent(self, tenant: Tenant) -> int | None:
        """Micro-units of `tenant`'s budget pool spent in the current period, as this router last learnt it:
        the pool's total granted at the last renewal, less what this router holds unspent (so another
        router's unspent share counts as spent, at most one share each). None when unknown: no budget, or
        the store has not answered for it in the current period (a grace share is not the store's word)."""
        budget = tenant.limits.budget
        share = self._shares.get(limit_key(tenant, "budget"))
        if budget is None or share is None or not share.answered:
            return None
        if share.window_end - share.window_start != budget.period_seconds:
            return None  # the period changed with a new revision: the held share counts another window
        if not share.window_start <= self._clock() < share.window_end:
            return None
        return max(0, share.taken - share.balance)

    async def admit(self, chain: Sequence[Tenant], estimate: Estimate) -> PoolAdmission | LimitRefused:
        """Let a request in, or refuse it naming the level and limit. Charges every level of the chain.

        A request refused on a concurrency limit whose other slots other router processes hold waits up to
        `slot_wait` seconds for one of them to give a slot back (`Slots.wait_for_room`): the slot of a
        request that just ended in another process is not counted twice against the client's next one."""
        chain = tuple(chain)
        plan = self._plan(chain)
        needs = _needs(estimate)
        admitted = self._admit_from_shares(plan, estimate, needs, self._clock())
        if admitted is not None:
            return admitted
        # It waits from here (a renewal, the store's word on a slot), counted as waiting on its levels'
        # concurrency: whoever asks the store for a slot asks for the requests waiting too, so a burst on an
        # idle limit costs one or two store round trips, not one per request one after another.
        with self._slots.waiting(key for key, _cap in plan.capped):
            got = await self._admit(plan, estimate, needs)
            if not isinstance(got, LimitRefused) or got.metric != "concurrency":
                return got
            deadline = time.monotonic() + self._slot_wait
            while isinstance(got, LimitRefused) and got.metric == "concurrency":
                key = limit_key(Tenant(got.level, got.tenant), "concurrency")
                if not await self._slots.wait_for_room(key, int(got.limit), deadline):
                    break
                got = await self._admit(plan, estimate, needs)
        return got

    async def _admit(
        self, plan: _Plan, estimate: Estimate, needs: dict[Metric, float]
    ) -> PoolAdmission | LimitRefused:
        # The common case (every share covers the request, nothing capped is full) needs no store and no
        # await: decided here in one step of the event loop, even while another request renews a share.
        while True:
            admitted = self._admit_from_shares(plan, estimate, needs, self._clock())
            if admitted is not None:
                return admitted
            if not self._lock.locked():
                break
            # Someone is renewing, most likely what this request lacks: wait for that to end, then look again.
            # Every such waiter wakes in the same loop step, and those still short wait for the next renewal
            # here too, never in the lock's queue: an asyncio.Lock hands over to one waiter per loop step, so
            # at concurrency 64 the last waited over a second behind a 40 ms renewal (and, behind a slot ask
            # that let in only the first few, 400 ms with nothing left to renew).
            await self._unlocked.wait()
        async with self._lock:  # free (checked above), so taken without yielding
            self._unlocked.clear()
            try:
                return await self._admit_renewing(plan, estimate, needs)
            finally:
                self._unlocked.set()

    async def _admit_renewing(
        self, plan: _Plan, estimate: Estimate, needs: dict[Metric, float]
    ) -> PoolAdmission | LimitRefused:
        """Renew what falls short (through the store), then decide. Requests admitted from the shares while
        this one awaits may spend what it renewed: the shares are looked at again until none falls short or a
        renewal brings nothing more (the pool is empty, or the store is away and the grace share is spent).
        The clock is read again after the awaits: a window may have ended meanwhile, and a request admitted from
        the shares since then has started the new window's shares, empty until renewed (they are renewed too)."""
        now = self._clock()
        while True:
            grew = short = False
            for tenant, pools in plan.pools:
                for pool in pools:
                    share = self._share(pool, now)
                    if share.balance < needs[pool.metric]:
                        short, before = True, share.balance
                        await self._renew(tenant, pool.metric, share, math.ceil(needs[pool.metric]), now)
                        grew = grew or share.balance > before
            for key, cap in plan.capped:
                await self._slots.ensure(key, cap)
            now = self._clock()
            if self._covered(plan, needs, now) or (short and not grew):
                break
        states = [self._state(tenant, pools) for tenant, pools in plan.pools]
        decision = decide(states, estimate, now)
        if isinstance(decision, LimitRefused):
            return decision
        return self._charge(plan, estimate, needs, decision)

    def _covered(self, plan: _Plan, needs: dict[Metric, float], now: float) -> bool:
        return all(self._share(p, now).balance >= needs[p.metric] for _, pools in plan.pools for p in pools)

    def _admit_from_shares(
        self, plan: _Plan, estimate: Estimate, needs: dict[Metric, float], now: float
    ) -> PoolAdmission | None:
        """Admit without renewing anything, or None when a share falls short or a concurrency cap is
        reached. When every share covers the request `decide` can only allow it, so this skips building
        its inputs and sets the same headers it would: the tightest level per metric, after the charge."""
        tightest: dict[Metric, tuple[_Share, float]] = {}
        for _tenant, pools in plan.pools:
            for pool in pools:
                share = self._share(pool, now)
                if share.balance < needs[pool.metric]:
                    return None
                if pool.metric != "budget":
                    left = max(0, share.limit - share.taken) + share.balance
                    best = tightest.get(pool.metric)
                    if best is None or left < best[1]:
                        tightest[pool.metric] = (share, left)
        for key, cap in plan.capped:
            if not self._slots.free(key, cap):
                return None
        headers: dict[str, str] = {}
        for metric in RATE_HEADER_METRICS:
            found = tightest.get(metric)
            if found is not None:
                put_rate_headers(
                    headers, metric, found[0].limit, found[1] - needs[metric], found[0].window_end - now
                )
        return self._charge(plan, estimate, needs, Allowed(headers))

    def end(self, admission: PoolAdmission) -> None:
        """The answer's last bytes are about to go out: give back its concurrency slots (once), before the
        client can read them and send its next request. `finish` does it too for a request that never got
        that far."""
        if admission.ended:
            return
        admission.ended = True
        for key, _cap in self._plan(admission.chain).capped:
            self._slots.release(key)

    def finish(self, admission: PoolAdmission, tokens: int, cost: float) -> None:
        """The request ended: release its concurrency (unless `end` did) and correct the token and budget
        estimates."""
        self.end(admission)
        plan = self._plan(admission.chain)
        actual: dict[Metric, int] = {"tokens": tokens, "budget": to_micros(cost)}
        for pool in plan.corrected:
            share = self._shares.get(pool.key)
            if share is None or admission.charged.get(pool.key) != share.window_start:
                continue  # the window it was charged in is over: nothing left to correct
            estimated = need(pool.metric, admission.estimate)
            share.balance -= int(actual[pool.metric] - estimated)

    def _plan(self, chain: tuple[Tenant, ...]) -> _Plan:
        plan = self._plans.get(id(chain))
        if plan is None or plan.chain is not chain:  # the plan holds the chain, so its id is not reused
            if len(self._plans) > 10_000:
                self._plans.clear()  # callers building a new tuple per request: bounded, rebuilt on demand
            plan = self._plans[id(chain)] = _Plan.of(chain)
        return plan

    def _share(self, pool: _Pool, now: float) -> _Share:
        share = self._shares.get(pool.key)
        if (
            share is None
            or not share.window_start <= now < share.window_end
            or share.window_end - share.window_start != pool.length
        ):
            start, end = window_bounds(now, pool.length)
            if share is None or share.window_start != start:
                share = _Share(
                    start, end, pool.limit
                )  # a new window: last window's balance and debt are gone
                self._shares[pool.key] = share
        share.limit = pool.limit  # a limit changed by a new revision applies at once
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
                log.warning(
                    "limit store unreachable, serving on held shares: %s",
                    unreachable_words(exc, self._timeout),
                )
            else:
                share.balance += grant.granted
                share.taken = grant.taken
                share.answered = True
                return
        if self._policy.grace and not share.grace_used:
            share.grace_used = True
            ledger = self._grace_ledger
            if ledger is None or await asyncio.to_thread(
                ledger.take, key, share.window_start, share.window_end, now
            ):
                share.balance += size

    async def _seed_budget(self, tenant: Tenant, key: str, share: _Share, now: float) -> None:
        """A budget window's first row starts at what usage says was spent in it, so spend recorded before
        the row existed (or before a store move) counts."""
        async with asyncio.timeout(self._timeout):
            spent = await self._store.spend(tenant.level, tenant.name, share.window_start, share.window_end)
            taken = math.ceil(spent * MICROS)
            await self._store.seed_counter(key, share.window_start, share.window_end, taken, now)
        share.seeded = True

    def _state(self, tenant: Tenant, pools: tuple[_Pool, ...]) -> LevelState:
        meters: dict[Metric, Meter] = {}
        for pool in pools:
            share = self._shares[pool.key]
            left = max(0, share.limit - share.taken) + share.balance
            meters[pool.metric] = Meter(share.limit, share.balance, share.window_end, left)
        cap = tenant.limits.concurrency
        if cap is not None:
            meters["concurrency"] = Meter(
                cap, self._slots.available(limit_key(tenant, "concurrency"), cap), None
            )
        return LevelState(tenant, meters)

    def _charge(
        self, plan: _Plan, estimate: Estimate, needs: dict[Metric, float], allowed: Allowed
    ) -> PoolAdmission:
        charged: dict[str, float] = {}
        for _tenant, pools in plan.pools:
            for pool in pools:
                share = self._shares[pool.key]
                share.balance -= math.ceil(needs[pool.metric])
                charged[pool.key] = share.window_start
        for key, _cap in plan.capped:
            self._slots.take(key)
        return PoolAdmission(plan.chain, estimate, allowed.headers, charged)
