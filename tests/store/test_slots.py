"""Concurrency pooled through the store: holds per router process, their expiry, idle slots given back, and
the outage rule (llmgw.store.limits.slots)."""

from __future__ import annotations

import asyncio
import time

from support import wait_for

from llmgw.core.tenancy.limits import Estimate, LevelLimits, LimitRefused, Tenant
from llmgw.store import Store
from llmgw.store.limits.limiter import PoolAdmission, PoolLimiter
from llmgw.store.limits.slots import PooledSlots

from .fakes import FakeStore

KEY = "project:p:concurrency"
T0 = 1_200_000.0


def capped(concurrency: int) -> tuple[Tenant, ...]:
    return (Tenant("project", "p", LevelLimits(concurrency=concurrency)),)


async def test_racing_holders_never_hold_more_than_the_limit(store: Store) -> None:
    """Eight holders on two connections each ask for 5 of 16 at once: 16 are held between them, never 17."""
    second = await Store.open(store.dsn)
    try:
        got = await asyncio.gather(
            *((store, second)[i % 2].hold_slots(KEY, f"h{i}", 5, 16, T0, T0 + 30) for i in range(8))
        )
    finally:
        await second.close()
    assert sum(got) == 16
    assert await store.slots_held(KEY, T0) == 16


async def test_a_decrease_frees_slots_and_a_lapsed_hold_frees_them_all(store: Store) -> None:
    assert await store.hold_slots(KEY, "a", 10, 16, T0, T0 + 30) == 10
    assert await store.hold_slots(KEY, "b", 10, 16, T0, T0 + 30) == 6  # what a's hold leaves
    assert await store.hold_slots(KEY, "a", 4, 16, T0 + 1, T0 + 31) == 4  # a gives 6 back
    assert await store.hold_slots(KEY, "b", 12, 16, T0 + 1, T0 + 31) == 12
    # b stops renewing (a router killed with -9): at its expiry its slots are free for a.
    assert await store.renew_slots("a", T0 + 20, T0 + 50) == 1
    assert await store.hold_slots(KEY, "a", 16, 16, T0 + 31, T0 + 61) == 16
    assert await store.drop_slots("a") == 1
    assert await store.slots_held(KEY, T0 + 31) == 0


async def test_spare_slots_are_held_only_while_the_pool_stays_half_free(store: Store) -> None:
    assert await store.hold_slots(KEY, "a", 10, 40, T0, T0 + 30, spare=5) == 15  # 15 of 40: spare given
    assert await store.hold_slots(KEY, "b", 10, 40, T0, T0 + 30, spare=5) == 10  # 25 held with it: no spare
    assert await store.slots_wanted_at(KEY) is None  # a spare not given is no shortfall
    assert await store.hold_slots(KEY, "c", 20, 40, T0, T0 + 30, spare=5) == 15  # what a and b leave
    assert await store.slots_wanted_at(KEY) == T0  # short of what it wanted: a's idle spare goes back


async def test_two_pooled_processes_reach_the_limit_and_give_idle_slots_back(store: Store) -> None:
    """Two limiters (two router processes) on their own connections: 16 of 20 requests in flight are let
    in, the rest refused naming concurrency; slots one of them frees are given back and used by the other."""
    second = await Store.open(store.dsn)
    pools = [PooledSlots(store, "r1", linger=0.01), PooledSlots(second, "r2", linger=0.01)]
    for pool in pools:
        await pool.start()
    try:
        routers = [PoolLimiter(store, slots=pools[0]), PoolLimiter(second, slots=pools[1])]
        tenants = capped(16)
        first = await asyncio.gather(*(routers[i % 2].admit(tenants, Estimate(1)) for i in range(20)))
        admitted = [(i % 2, a) for i, a in enumerate(first) if isinstance(a, PoolAdmission)]
        refused = [a for a in first if isinstance(a, LimitRefused)]
        assert len(admitted) == 16 and len(refused) == 4
        assert all((r.level, r.metric, r.limit) == ("project", "concurrency", 16) for r in refused)
        # Router 0 finishes all it had: router 1 gets them once router 0 gave them back.
        mine = [a for who, a in admitted if who == 0]
        for a in mine:
            routers[0].finish(a, 1, 0.0)
        more = await wait_for(
            lambda: _admit_all(routers[1], tenants, len(mine)), 10, "router 2 admitted the freed slots"
        )
        assert len(more) == len(mine)
        assert isinstance(await routers[1].admit(tenants, Estimate(1)), LimitRefused)
        assert await store.slots_held(KEY, time.time()) == 16
    finally:
        for pool in pools:
            await pool.close()
        await second.close()
    assert await store.slots_held(KEY, 0.0) == 0  # closing gave every slot back


async def _admit_all(router: PoolLimiter, tenants: tuple[Tenant, ...], n: int) -> list[PoolAdmission] | None:
    got = [await router.admit(tenants, Estimate(1)) for _ in range(n)]
    ok = [a for a in got if isinstance(a, PoolAdmission)]
    if len(ok) == n:
        return ok
    for a in ok:
        router.finish(a, 1, 0.0)
    return None


async def test_outage_serves_held_slots_then_one_grace_share_then_refuses() -> None:
    fake = FakeStore()
    # no returns during the test, and one slot asked for at a time (no spare)
    pool = PooledSlots(fake, "r1", clock=lambda: T0, linger=3600, spare_fraction=0)
    router = PoolLimiter(fake, clock=lambda: T0, slots=pool)
    tenants = capped(16)
    held = [await router.admit(tenants, Estimate(1)) for _ in range(3)]
    assert all(isinstance(a, PoolAdmission) for a in held)
    first = held[0]
    assert isinstance(first, PoolAdmission)
    router.finish(first, 1, 0.0)  # one of its 3 held slots is idle now
    fake.down = True
    during = [await router.admit(tenants, Estimate(1)) for _ in range(6)]
    # 1 idle held slot, then the grace share (10% of 16 = 2), then refusals naming concurrency.
    assert [isinstance(a, PoolAdmission) for a in during] == [True, True, True, False, False, False]
    refusal = during[-1]
    assert isinstance(refusal, LimitRefused) and refusal.metric == "concurrency"
    fake.down = False
    await pool._end_grace()  # what the background loop does once the store answers
    assert fake.holds[(KEY, "r1")][0] == 5  # what is in flight, held again
    assert pool.available(KEY, 16) == 0  # the grace is over: nothing more without the store's word


def _counting_asks(fake: FakeStore) -> list[int]:
    """The `want` of every hold_slots call from now on (a pass that keeps idle slots still reads whether the
    pool is wanted: that read is no ask)."""
    asks: list[int] = []
    hold = fake.hold_slots

    async def counted(
        limit_key: str, holder: str, want: int, limit: int, now: float, expires_at: float, spare: int = 0
    ) -> int:
        asks.append(want)
        return await hold(limit_key, holder, want, limit, now, expires_at, spare)

    fake.hold_slots = counted  # type: ignore[method-assign]
    return asks


async def test_a_fluctuating_load_keeps_its_slots_and_an_ended_one_gives_them_back() -> None:
    """The return passes (run by hand here, as the background loop runs them after each linger) keep the most
    that was in flight through the last `idle_passes` passes: a load going up and down asks the store for no
    slot; once it stops, the slots go back when that many passes found them idle."""
    fake = FakeStore()
    pool = PooledSlots(fake, "r1", clock=lambda: T0, idle_passes=3, spare_fraction=0)  # exact holds
    router = PoolLimiter(fake, clock=lambda: T0, slots=pool)
    tenants = capped(100)
    running = [await router.admit(tenants, Estimate(1)) for _ in range(16)]
    busy = [a for a in running if isinstance(a, PoolAdmission)]
    assert len(busy) == 16
    asks = _counting_asks(fake)
    for _ in range(50):
        for a in busy[:4]:
            router.finish(a, 1, 0.0)
        await pool._return_idle()
        again = [await router.admit(tenants, Estimate(1)) for _ in range(4)]
        busy = busy[4:] + [a for a in again if isinstance(a, PoolAdmission)]
    assert len(busy) == 16
    assert asks == [], "a steady load of 16 asked the store for slots again"
    for a in busy:
        router.finish(a, 1, 0.0)
    await pool._return_idle()  # 16 were busy during this linger: kept
    assert fake.holds[(KEY, "r1")][0] == 16
    for _ in range(2):
        await pool._return_idle()  # idle through one and two passes: still among the last 3
        assert fake.holds[(KEY, "r1")][0] == 16
    await pool._return_idle()  # idle through 3 passes: given back
    assert fake.holds[(KEY, "r1")][0] == 0


async def test_a_slot_kept_idle_in_one_process_goes_to_the_request_another_one_holds_back() -> None:
    """Issue 37: process a's requests ended and their slots linger there; process b is asked for the client's
    next request. b's ask comes up short, which marks the pool wanted; the request waits (it is not refused)
    while a's next pass reads that and gives back every idle slot, and b's next ask gets one."""
    fake = FakeStore()
    a, b = PooledSlots(fake, "a", clock=lambda: T0), PooledSlots(fake, "b", clock=lambda: T0)
    in_a, in_b = PoolLimiter(fake, clock=lambda: T0, slots=a), PoolLimiter(fake, clock=lambda: T0, slots=b)
    tenants = capped(4)
    ended = [await in_a.admit(tenants, Estimate(1)) for _ in range(4)]
    for admission in ended:
        assert isinstance(admission, PoolAdmission)
        in_a.finish(admission, 1, 0.0)
    assert fake.holds[(KEY, "a")][0] == 4  # idle, lingering in a
    waiting = asyncio.create_task(in_b.admit(tenants, Estimate(1)))
    await wait_for(lambda: KEY in fake.wanted, 5, "b's short ask marking the pool wanted")
    assert not waiting.done()
    await a._return_idle()  # a's next pass (the background loop runs it after the linger)
    assert fake.holds[(KEY, "a")][0] == 0, "a kept idle slots another process wanted"
    async with asyncio.timeout(5):
        assert isinstance(await waiting, PoolAdmission)
    assert fake.holds[(KEY, "b")][0] >= 1


async def test_a_request_over_the_limit_is_still_refused_after_its_wait() -> None:
    """Slots busy in another process are not given back: the request waits its `slot_wait` and is refused,
    naming the limit; one whose own process fills the limit is refused without waiting for anything."""
    fake = FakeStore()
    a, b = PooledSlots(fake, "a", clock=lambda: T0), PooledSlots(fake, "b", clock=lambda: T0)
    in_a = PoolLimiter(fake, clock=lambda: T0, slots=a)
    in_b = PoolLimiter(fake, clock=lambda: T0, slots=b, slot_wait=0.3)
    tenants = capped(4)
    busy = [await in_a.admit(tenants, Estimate(1)) for _ in range(4)]
    assert all(isinstance(x, PoolAdmission) for x in busy)
    refused = await in_b.admit(tenants, Estimate(1))
    assert isinstance(refused, LimitRefused) and refused.metric == "concurrency"
    asks = _counting_asks(fake)
    own = await in_a.admit(tenants, Estimate(1))
    assert isinstance(own, LimitRefused) and own.metric == "concurrency"
    assert asks == [], "a limit full of this process's own requests was asked for more"


async def test_a_burst_on_an_idle_limit_asks_the_store_for_its_slots_together() -> None:
    """16 requests at once on a limit with no slot held (a client's burst after a quiet moment): the ask for a
    slot asks for every request waiting behind it too, so the 16th is not let in only after 16 store round
    trips one after another (each a write transaction: seen stalling benchmarks/router_overhead.py's runs)."""
    fake = FakeStore()
    pool = PooledSlots(fake, "r1", clock=lambda: T0, linger=3600)  # no returns during the test
    router = PoolLimiter(fake, clock=lambda: T0, slots=pool)
    asks = _counting_asks(fake)
    got = await asyncio.gather(*(router.admit(capped(100), Estimate(1)) for _ in range(16)))
    assert all(isinstance(a, PoolAdmission) for a in got), got
    assert len(asks) <= 2 and asks[-1] == 16, asks


def _gated(fake: FakeStore, method: str) -> asyncio.Event:
    """Make one of the fake store's calls wait until the returned event is set (a store busy elsewhere)."""
    gate = asyncio.Event()
    call = getattr(fake, method)

    async def waiting(*args: object) -> object:
        await gate.wait()
        return await call(*args)

    setattr(fake, method, waiting)
    return gate


async def test_a_load_swinging_within_its_spare_asks_nothing_and_its_slots_go_back_when_it_ends() -> None:
    """A hold keeps a quarter more than the busiest moment of its last passes while the pool is far from full.
    A busy router's count in flight swings by several from one linger to the next; without the spare each
    rise asked the store, and every request finding no slot free waited for that ask (on SQLite under a
    usage backlog, 200-400 ms at concurrency 64). A rising load asks a few times, not once per request."""
    fake = FakeStore()
    pool = PooledSlots(fake, "r1", clock=lambda: T0, idle_passes=3)
    router = PoolLimiter(fake, clock=lambda: T0, slots=pool)
    tenants = capped(100)
    asks = _counting_asks(fake)
    running = [await router.admit(tenants, Estimate(1)) for _ in range(16)]
    busy = [a for a in running if isinstance(a, PoolAdmission)]
    assert len(busy) == 16
    assert asks == [1, 3, 5, 8, 11, 15], asks  # each ask holds a quarter more than it wants
    assert fake.holds[(KEY, "r1")][0] == 19
    asks.clear()
    for n in range(50):
        swing = 3 if n % 2 else 0  # 16 in flight, then 19, then 16 ...
        for a in busy[: 4 + swing]:
            router.finish(a, 1, 0.0)
        await pool._return_idle()
        again = [await router.admit(tenants, Estimate(1)) for _ in range(4 + (3 - swing))]
        busy = busy[4 + swing :] + [a for a in again if isinstance(a, PoolAdmission)]
    assert asks == [], "a load swinging within its spare asked the store"
    for a in busy:
        router.finish(a, 1, 0.0)
    for _ in range(3):
        await pool._return_idle()  # busy during the first linger, then idle through 1 and 2 passes: kept
        assert fake.holds[(KEY, "r1")][0] == 19
    await pool._return_idle()  # idle through 3 passes: given back, spare and all
    assert fake.holds[(KEY, "r1")][0] == 0


async def test_an_ask_that_waited_for_another_does_not_cut_the_hold_it_made() -> None:
    """Two requests find no slot free; the second waits while the first's ask is under way, and requests end
    meanwhile. The first ask raised the hold; the second must not then set it to the fewer now in flight (a
    cut the busy process asked back one slot at a time, each ask a store trip a request waited for: at 2,700
    requests a second on SQLite, a p99 of 170 ms)."""
    fake = FakeStore()
    # no returns during the test, and one slot asked for at a time (no spare)
    pool = PooledSlots(fake, "r1", clock=lambda: T0, linger=3600, spare_fraction=0)
    for _ in range(4):
        await pool.ensure(KEY, 100)
        pool.take(KEY)
    assert fake.holds[(KEY, "r1")][0] == 4
    gate = _gated(fake, "hold_slots")
    asks = _counting_asks(fake)  # counted as they are sent, before the gate
    first = asyncio.create_task(pool.ensure(KEY, 100))
    await wait_for(lambda: asks or None, 5, "the first ask")
    second = asyncio.create_task(pool.ensure(KEY, 100))
    await asyncio.sleep(0)
    for _ in range(3):
        pool.release(KEY)  # three requests end while the first ask is under way
    gate.set()
    async with asyncio.timeout(5):
        await asyncio.gather(first, second)
    assert asks == [5], asks
    assert fake.holds[(KEY, "r1")][0] == 5
    assert pool.available(KEY, 100) == 4


async def test_a_request_asking_for_a_slot_does_not_wait_for_a_return_pass_reading_the_store() -> None:
    """A return pass reads whether another process wants the idle slots; that read may wait behind other
    store work. A request that needs one more slot asks at once, not after that read."""
    fake = FakeStore()
    pool = PooledSlots(fake, "r1", clock=lambda: T0, linger=3600, spare_fraction=0)  # exact holds
    for _ in range(4):
        await pool.ensure(KEY, 100)
        pool.take(KEY)
    pool.release(KEY)  # one slot idle: the next pass reads whether the pool is wanted
    gate = _gated(fake, "slots_wanted_at")
    passing = asyncio.create_task(pool._return_idle())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not passing.done()
    pool.take(KEY)  # the idle slot is in use again: the next request needs one more
    async with asyncio.timeout(5):
        await pool.ensure(KEY, 100)
    assert fake.holds[(KEY, "r1")][0] == 5
    gate.set()
    async with asyncio.timeout(5):
        await passing
