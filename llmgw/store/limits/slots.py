"""Concurrency limits: requests in flight, counted in this process (`LocalSlots`) or pooled across every
router process through the store (`PooledSlots`).

rpm, tpm and budget are counts over a window; concurrency is a level, and slots come back when requests end.
A pooled router process ("holder") holds some of a limit's slots in the store: one row per (limit, holder)
with a count and an expiry (`Store.hold_slots`). It admits a request locally while it has a held slot free,
asks the store for one more only when all its slots are busy, and gives back the slots no request of its
own used through its last `idle_passes` return passes (one pass per `linger`: about a second), so another
router can use them. Why so long: a busy process's count of requests in flight swings by several from one
linger to the next, and a hold cut to the last linger's busiest moment was asked up again a moment later,
each ask one store round trip a request waited for (at 2,700 requests a second on the SQLite store, its
p99 was 170 ms against the 5 ms median). Another process that wants them does not wait that long (below).
Why not one row per request: two store round trips on every limited request; with holds, a process whose
load is steady costs no round trip per request, and only a rising level does.

Spare slots: while the pool stays at most half full, a hold is a quarter more than asked for (at least one),
and a return pass keeps a quarter more than the busiest moment (`spare_fraction`). At concurrency 64 the count
in flight in one router swung between about 33 and 46 from one linger to the next: each rise past the hold
was an ask, and every request finding no slot free waited for it (200-400 ms on SQLite behind the usage
writer's batches). With the spare, a load swinging within a quarter asks nothing, and a rising one asks a few
times, not once per slot. Why only while half the pool is free: a slot held idle by one router is a slot
another must wait for, so near the limit a hold is exactly what was asked (and a short ask still takes idle
slots back from the others, below).

Slots another process wants are not kept idle (issue 37: a client keeping exactly its limit in flight moves
its next request to another worker the moment it read the end of the last answer, and must not be refused
for a slot that request's worker still holds). An ask that comes up short marks the pool wanted
(`Store.hold_slots` sets `wanted_at`); a process keeping idle slots reads that on its next pass (one read
per linger, only while it keeps idle slots) and gives back every slot no request of its own is in or waiting
for, then for `wanted_for` seconds gives idle slots back without a linger. The short request waits meanwhile
instead of being refused (`wait_for_room`, bounded by the limiter's `slot_wait`), asking again every
`linger / 10`; it counts as waiting on every level of its chain (`waiting`), so two processes each waiting on a
level the other keeps idle slots of give them to each other. What it costs: nothing on a request a held slot
admits; under contention, the wait (about one linger the first time, one store round trip after) and the
asks. A request over the limit (every slot busy somewhere) is refused after that wait; one whose own
process fills the limit, or while the store is away, at once.

Holds are renewed every `ttl / 3`; a holder that dies gives its slots back when its rows lapse (`ttl`).

Outage rule (as for the windowed limits: serve on what is held, then one grace share, then refuse): while
the store cannot be reached, a process keeps admitting on the slots it holds, and may admit ONE grace share
more per limit (the policy's share size: 10% of the limit, at least 1) for as long as the outage lasts. So a
pool can be exceeded by at most one grace share per router process during an outage. When the store answers
again the grace is over: the process asks to hold what it has in flight; what the pool cannot give back
drains as those requests end (no request is admitted until the process is under its hold again). Holds that
lapsed during a long outage (longer than `ttl`) may have been taken by others meanwhile: the same drain
applies. No grace ledger: a restarted process's requests died with it, so a restart does not add to the
margin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.store.errors import StoreUnavailable, unreachable_words

log = logging.getLogger(__name__)

__all__ = ["LocalSlots", "PooledSlots", "SlotStore", "Slots", "holder_id"]


class Slots(Protocol):
    """What the limiter asks of a concurrency counter. `free`, `available`, `take` and `release` are
    synchronous (the request path's common case); `ensure` and `wait_for_room` may ask the store."""

    def free(self, key: str, cap: int) -> bool: ...
    def available(self, key: str, cap: int) -> int: ...
    async def ensure(self, key: str, cap: int) -> None: ...
    async def wait_for_room(self, key: str, cap: int, until: float) -> bool: ...
    def waiting(self, keys: Iterable[str]) -> contextlib.AbstractContextManager[None]: ...
    def take(self, key: str) -> None: ...
    def release(self, key: str) -> None: ...


class LocalSlots:
    """Requests in flight in this process: the whole limit is this process's (one router, no store)."""

    def __init__(self) -> None:
        self._inflight: dict[str, int] = {}

    def free(self, key: str, cap: int) -> bool:
        return self._inflight.get(key, 0) < cap

    def available(self, key: str, cap: int) -> int:
        return cap - self._inflight.get(key, 0)

    async def ensure(self, key: str, cap: int) -> None:
        return None

    async def wait_for_room(self, key: str, cap: int, until: float) -> bool:
        return False  # every slot is in this process: a full limit is full of its own requests

    def waiting(self, keys: Iterable[str]) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def take(self, key: str) -> None:
        self._inflight[key] = self._inflight.get(key, 0) + 1

    def release(self, key: str) -> None:
        self._inflight[key] = max(0, self._inflight.get(key, 0) - 1)


class SlotStore(Protocol):
    """The part of the store `PooledSlots` uses (`llmgw.store.Store`)."""

    async def hold_slots(
        self,
        limit_key: str,
        holder: str,
        want: int,
        limit: int,
        now: float,
        expires_at: float,
        spare: int = 0,
    ) -> int: ...
    async def renew_slots(self, holder: str, now: float, expires_at: float) -> int: ...
    async def drop_slots(self, holder: str) -> int: ...
    async def slots_wanted_at(self, limit_key: str) -> float | None: ...


def holder_id(router_id: str) -> str:
    """A name for this process's holds: unique per process start, so a restarted worker never mistakes
    the lapsing rows of its predecessor for its own."""
    return f"{router_id}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass
class _Hold:
    held: int = 0  # slots the store holds for us (never more than the store's row says)
    inflight: int = 0
    peak: int = 0  # the most in flight or waiting since the last return pass
    # The peaks of the last few passes, newest last: the most of them is what is kept held.
    recent_peaks: deque[int] = field(default_factory=deque)
    cap: int = 0  # the limit as last seen
    grace: int = 0  # slots admitted on our own authority while the store is away
    grace_used: bool = False
    waiting: int = 0  # requests here waiting for a slot another process may give back
    asked_at: float = -math.inf  # time.monotonic() of the last ask: waiters ask at most once per poll
    asks: int = 0  # asks made: a return pass's read of the pool's mark during one is not trusted
    wanted_seen: float | None = None  # the pool's wanted_at as last read (Store.slots_wanted_at)
    short_at: float | None = None  # the `now` of our own last ask that came up short
    wanted_until: float = -math.inf  # time.monotonic(): until then idle slots go back without a linger


class PooledSlots:
    """Concurrency slots held in the store by this process; see the module docstring for the rules."""

    def __init__(
        self,
        store: SlotStore,
        holder: str,
        *,
        clock: Callable[[], float] = time.time,
        ttl: float = 30.0,
        linger: float = 0.1,
        store_timeout: float = 2.0,
        retry_interval: float = 1.0,
        grace_fraction: float = 0.1,
        wanted_for: float = 5.0,
        idle_passes: int = 10,
        spare_fraction: float = 0.25,
    ) -> None:
        self._store = store
        self.holder = holder
        self._clock = clock
        self._ttl = ttl
        self._linger = linger
        self._idle_passes = idle_passes  # a slot idle through this many return passes goes back
        # held beyond the busiest moment while the pool is far from full
        self._spare_fraction = spare_fraction
        self._poll = linger / 10  # how often a waiter asks the store again (one ask per limit at a time)
        self._wanted_for = wanted_for  # how long a limit another process came up short on stays wanted
        self._timeout = store_timeout
        self._retry_interval = retry_interval
        self._grace_fraction = grace_fraction
        self._holds: dict[str, _Hold] = {}
        self._idle: set[str] = set()  # keys that may hold more than they have in flight
        self._wake = asyncio.Event()
        self._urgent = False  # a wanted limit's slot went idle: the next pass runs without a linger
        self._lock = asyncio.Lock()  # one change of a hold at a time: each sets an absolute count
        self._down_until = -math.inf
        self._down = False
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------ request path

    def _hold(self, key: str) -> _Hold:
        found = self._holds.get(key)
        if found is None:
            found = self._holds[key] = _Hold()
        return found

    def available(self, key: str, cap: int) -> int:
        h = self._holds.get(key)
        if h is None:
            return 0
        return min(h.held, cap) + h.grace - h.inflight

    def free(self, key: str, cap: int) -> bool:
        return self.available(key, cap) >= 1

    def take(self, key: str) -> None:
        h = self._hold(key)
        h.inflight += 1
        h.peak = max(h.peak, h.inflight)

    def release(self, key: str) -> None:
        h = self._hold(key)
        h.inflight = max(0, h.inflight - 1)
        self._idle.add(key)
        if h.wanted_until > time.monotonic():
            self._urgent = True
        self._wake.set()

    async def ensure(self, key: str, cap: int) -> None:
        """Make a slot free for one more request if the pool has one: ask the store to hold one more, or
        during an outage take this limit's grace share. Returns with no slot free when the pool is full."""
        h = self._hold(key)
        h.cap = cap
        if self.available(key, cap) >= 1 or h.inflight >= cap:
            return
        now = self._clock()
        if now >= self._down_until:
            try:
                async with self._lock:
                    if self.available(key, cap) >= 1:
                        # An ask that held the lock meanwhile made room. Asking anyway would set the hold to
                        # what is in flight now, fewer than it was when this one found no room: a cut that a
                        # busy process then asked back one slot at a time, a store trip each.
                        return
                    want = min(cap, h.inflight + max(1, h.waiting))
                    h.asked_at = time.monotonic()
                    h.asks += 1
                    h.held = await self._set(key, want, cap, now, self._spare(want, cap))
                    if h.held < want:
                        h.short_at = now  # the store marks the pool wanted with it: our own demand
                # Another level may refuse the request this slot was for: then it is idle, and goes back.
                self._idle.add(key)
                self._wake.set()
                self._answered()
                h.grace, h.grace_used = 0, False
                return
            except (StoreUnavailable, TimeoutError) as exc:
                self._unreachable(now, exc)
        if not h.grace_used:
            h.grace_used = True
            h.grace = max(1, math.ceil(cap * self._grace_fraction))

    async def wait_for_room(self, key: str, cap: int, until: float) -> bool:
        """A request was refused on this limit: wait until `until` (a time.monotonic() instant) for a slot
        here, asking the store again every poll (one ask per limit at a time, for every waiter). Other
        processes hold the rest, and one that keeps a slot idle gives it back on its next pass (it reads that
        the pool is wanted). True when a slot is free here now; False at once when this process's own
        requests fill the limit or the store is away."""
        h = self._hold(key)
        if self._down:
            return False
        while self.available(key, cap) < 1:
            left = until - time.monotonic()
            if h.inflight >= cap or left <= 0:
                return False
            await asyncio.sleep(min(self._poll, left))
            if time.monotonic() - h.asked_at >= self._poll:
                await self.ensure(key, cap)
        return True

    @contextlib.contextmanager
    def waiting(self, keys: Iterable[str]) -> Iterator[None]:
        """A request waits for slots of every limit of `keys`: each is asked for one more for it, and a
        return pass keeps one for it, so that two processes each waiting on a limit the other keeps idle
        slots of do not hold each other up."""
        holds = [self._hold(key) for key in keys]
        for h in holds:
            h.waiting += 1
            h.peak = max(h.peak, h.inflight + h.waiting)  # a request waiting for a slot is demand too
        try:
            yield
        finally:
            for h in holds:
                h.waiting -= 1

    def _spare(self, busy: int, cap: int) -> int:
        """Slots to hold beyond `busy` when the pool has them to spare: a quarter more, at least one (none for
        none busy), within the limit."""
        return min(math.ceil(busy * self._spare_fraction), cap - busy) if busy > 0 else 0

    async def _set(self, key: str, want: int, cap: int, now: float, spare: int = 0) -> int:
        async with asyncio.timeout(self._timeout):
            return await self._store.hold_slots(key, self.holder, want, cap, now, now + self._ttl, spare)

    def _unreachable(self, now: float, exc: BaseException) -> None:
        self._down_until = now + self._retry_interval
        if not self._down:
            self._down = True
            log.warning(
                "limit store unreachable: concurrency is served on held slots and one grace share "
                "per limit (%s)",
                unreachable_words(exc, self._timeout),
            )

    def _answered(self) -> None:
        if self._down:
            self._down = False
            log.warning("limit store reachable again: concurrency slots are pooled through it again")

    # ------------------------------------------------------------------------------------ background

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="llmgw-concurrency-slots")

    async def close(self) -> None:
        """Stop renewing and give every held slot back at once (instead of when the holds lapse)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(StoreUnavailable, TimeoutError):
            async with asyncio.timeout(self._timeout):
                await self._store.drop_slots(self.holder)

    async def _run(self) -> None:
        renew_every = self._ttl / 3
        next_renew = time.monotonic() + renew_every
        while True:
            wait = self._retry_interval if self._down else max(0.0, next_renew - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
                    if not self._urgent:  # idle slots linger: the next request may reuse them
                        await asyncio.sleep(self._linger)
            self._wake.clear()
            self._urgent = False
            try:
                await self._return_idle()
                if self._down or time.monotonic() >= next_renew:
                    next_renew = time.monotonic() + renew_every
                    await self._renew()
                await self._end_grace()
            except (StoreUnavailable, TimeoutError) as exc:
                self._unreachable(self._clock(), exc)

    async def _return_idle(self) -> None:
        kept: set[str] = set()
        try:
            while self._idle:
                key = self._idle.pop()
                if await self._return_one(key):
                    kept.add(key)
        finally:
            if kept:  # looked at again after the next linger, when what was busy may have gone idle
                self._idle |= kept
                self._wake.set()

    async def _return_one(self, key: str) -> bool:
        """Give back what stayed idle through the last passes; True when idle slots were kept for now."""
        h = self._holds[key]
        if h.grace:
            return False  # an outage's grace: settled by _end_grace
        # The store is read outside the lock: a request's ask for a slot does not wait behind this read (on
        # a busy SQLite store, behind a usage batch too: tens of milliseconds).
        asks_before = h.asks
        try:
            wanted_at = await self._read_wanted(key, h)
        except BaseException:
            self._idle.add(key)
            raise
        async with self._lock:
            if h.grace:
                return False
            wanted = self._wanted(h, wanted_at, read_alone=h.asks == asks_before)
            # Keep what was in use at the busiest moment of the last few passes: a load that goes up and
            # down by a few requests does not give slots back and ask for them again each time. Unless
            # another process wants them: then every slot goes back now that no request here is in or
            # waiting for.
            busy = h.inflight + h.waiting
            h.recent_peaks.append(h.peak)
            if len(h.recent_peaks) > self._idle_passes:
                h.recent_peaks.popleft()
            h.peak = busy
            target = busy if wanted else max(busy, *h.recent_peaks)
            spare = 0 if wanted else self._spare(target, h.cap)
            if h.held <= target + spare:
                return h.held > h.inflight
            h.held = target + spare  # lowered before asking: no request is admitted on a slot being returned
            try:
                got = await self._set(key, target, h.cap, self._clock(), spare)
                h.held = min(target + spare, got)
            except BaseException:
                self._idle.add(key)
                raise
        self._answered()
        return h.held > h.inflight

    async def _read_wanted(self, key: str, h: _Hold) -> float | None:
        """The pool's `wanted_at` from the store; None without asking when it would change nothing: no slot
        is idle here, or the limit is known to be wanted."""
        if h.held <= h.inflight or h.wanted_until > time.monotonic():
            return None
        async with asyncio.timeout(self._timeout):
            return await self._store.slots_wanted_at(key)

    def _wanted(self, h: _Hold, wanted_at: float | None, read_alone: bool) -> bool:
        """Whether another process came up short on this limit lately. A mark read while an ask of ours was
        made may be that ask's own (its `short_at` not yet recorded when the read began): not trusted; the next
        pass reads again."""
        if h.wanted_until > time.monotonic():
            return h.held > h.inflight
        if wanted_at is None or not read_alone or wanted_at in (h.wanted_seen, h.short_at):
            return False
        h.wanted_seen = wanted_at
        h.wanted_until = time.monotonic() + self._wanted_for
        return True

    async def _renew(self) -> None:
        now = self._clock()
        async with asyncio.timeout(self._timeout):
            renewed = await self._store.renew_slots(self.holder, now, now + self._ttl)
        self._answered()
        holding = [k for k, h in self._holds.items() if h.held > 0]
        if renewed >= len(holding):
            return
        # Some holds lapsed (an outage longer than the ttl): ask for them again, as far as the pool allows.
        log.warning(
            "%d concurrency holds of %s lapsed; holding them again", len(holding) - renewed, self.holder
        )
        for key in holding:
            await self._reassert(key)

    async def _end_grace(self) -> None:
        """The store answers again: the grace is over. Hold what is in flight, as far as the pool allows;
        the rest drains as those requests end."""
        for key, h in list(self._holds.items()):
            if h.grace or h.grace_used:
                await self._reassert(key)

    async def _reassert(self, key: str) -> None:
        h = self._holds[key]
        async with self._lock:
            h.held = await self._set(key, max(h.held, h.inflight), h.cap, self._clock())
            h.grace, h.grace_used = 0, False
            self._idle.add(key)  # what is held beyond the requests in flight goes back after the linger
