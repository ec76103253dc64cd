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

    async def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        await self._enter()
        for r in records:
            self.usage.setdefault(r.id, r)
