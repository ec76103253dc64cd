"""A faithful in-memory fake of the store's counter and usage interfaces, with a switchable outage."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmgw.store import ShareGrant, StoreUnavailable, UsageRecord


@dataclass
class FakeStore:
    down: bool = False
    yield_inside: bool = True  # let other coroutines run mid-call, as a real round trip would
    counters: dict[tuple[str, float], int] = field(default_factory=dict)
    usage: dict[str, UsageRecord] = field(default_factory=dict)
    holds: dict[tuple[str, str], tuple[int, float]] = field(
        default_factory=dict
    )  # (key, holder) -> slots, expiry
    wanted: dict[str, float] = field(default_factory=dict)  # key -> when a holder last came up short
    calls: int = 0

    async def _enter(self) -> None:
        self.calls += 1
        if self.yield_inside:
            await asyncio.sleep(0)
        if self.down:
            raise StoreUnavailable("fake store is down")

    async def take_share(
        self, limit_key: str, window_start: float, window_end: float, want: int, limit: int, now: float
    ) -> ShareGrant:
        await self._enter()
        taken = self.counters.get((limit_key, window_start), 0)
        granted = max(0, min(want, limit - taken))  # same semantics as the SQL CASE expressions
        self.counters[(limit_key, window_start)] = taken + granted
        return ShareGrant(granted, taken + granted)

    async def seed_counter(
        self, limit_key: str, window_start: float, window_end: float, taken: int, now: float
    ) -> bool:
        await self._enter()
        if (limit_key, window_start) in self.counters:
            return False
        self.counters[(limit_key, window_start)] = taken
        return True

    async def spend(self, level: str, name: str, since: float, until: float | None = None) -> float:
        await self._enter()
        col = {"organization": "org"}.get(level, level)
        end = until if until is not None else float("inf")
        return sum(r.cost for r in self.usage.values() if getattr(r, col) == name and since <= r.time < end)

    async def hold_slots(
        self,
        limit_key: str,
        holder: str,
        want: int,
        limit: int,
        now: float,
        expires_at: float,
        spare: int = 0,
    ) -> int:
        await self._enter()
        used = sum(
            n for (k, h), (n, exp) in self.holds.items() if k == limit_key and h != holder and exp > now
        )
        # the SQL's CASE expressions
        held = want + spare if 2 * (used + want + spare) <= limit else max(0, min(want, limit - used))
        self.holds[(limit_key, holder)] = (held, expires_at)
        if held < want:
            self.wanted[limit_key] = now
        return held

    async def slots_wanted_at(self, limit_key: str) -> float | None:
        await self._enter()
        return self.wanted.get(limit_key)

    async def renew_slots(self, holder: str, now: float, expires_at: float) -> int:
        await self._enter()
        mine = [k for k, (n, exp) in self.holds.items() if k[1] == holder and n > 0 and exp > now]
        for k in mine:
            self.holds[k] = (self.holds[k][0], expires_at)
        self.holds = {k: v for k, v in self.holds.items() if v[1] > now and v[0] > 0}
        return len(mine)

    async def drop_slots(self, holder: str) -> int:
        await self._enter()
        mine = [k for k in self.holds if k[1] == holder]
        for k in mine:
            del self.holds[k]
        return len(mine)

    async def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        await self._enter()
        for r in records:
            self.usage.setdefault(r.id, r)
