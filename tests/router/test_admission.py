"""The admission queue's wake-ups: a freed slot goes to a waiter that can use it, in arrival order.

Driven without timers: each test decides when room appears and who can use it, then waits on the waiting
tasks themselves with a deadline. `has_room` is per request in the router (a retry excludes the endpoint it
failed on, a breaker may refuse a probe), so the front waiter can be unable to use a slot a later one could.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from llmgw_router.routing.admission import PASS_ON_LIMIT, Admission
from support import wait_for

DEADLINE_S = 5.0


class Slots:
    """Free slots of one model, and a record of who asked for one and who got it."""

    def __init__(self) -> None:
        self.free = 0
        self.tried: list[str] = []
        self.admitted: list[str] = []

    def room_for(self, name: str, can_use: Callable[[], bool] = lambda: True) -> Callable[[], bool]:
        def has_room() -> bool:
            self.tried.append(name)
            if self.free > 0 and can_use():
                self.free -= 1
                return True
            return False

        return has_room

    async def wait(self, adm: Admission, name: str, can_use: Callable[[], bool] = lambda: True) -> None:
        await adm.wait("m", self.room_for(name, can_use), 60)
        self.admitted.append(name)


async def _settle(adm: Admission) -> None:
    """Until every queued waiter has used its wake-up and is parked again: nothing more happens until the
    next notify, so what the slots saw is final."""
    await wait_for(lambda: adm.wake_ups_pending == 0, DEADLINE_S, "every waiter to be parked")


async def _queue(
    adm: Admission, slots: Slots, *waiters: tuple[str, Callable[[], bool]]
) -> list[asyncio.Task[None]]:
    tasks = [asyncio.create_task(slots.wait(adm, name, can_use)) for name, can_use in waiters]
    await wait_for(lambda: adm.depth == len(waiters), DEADLINE_S, f"{len(waiters)} waiters queued")
    return tasks


async def test_a_slot_the_front_waiter_cannot_use_goes_to_the_next_and_the_front_keeps_its_place() -> None:
    # Head of line: `a` (say a retry excluding the endpoint that freed up) is woken first and cannot use the
    # slot; `b` behind it can. Without passing the wake-up on, `b` waits until its timeout while a slot is free.
    adm = Admission(10)
    slots = Slots()
    a_can = False
    a, b, c = await _queue(adm, slots, ("a", lambda: a_can), ("b", lambda: True), ("c", lambda: True))

    slots.free = 1
    adm.notify("m")
    await asyncio.wait_for(b, DEADLINE_S)
    await _settle(adm)
    # After `b`, the queue looks once more in case room was left (`a` again, then `c`): there was none.
    assert slots.admitted == ["b"] and slots.tried == ["a", "b", "a", "c"]
    assert not a.done() and not c.done() and adm.depth == 2  # one slot, one admission

    # `a` kept its place at the front: the next slot it can use is its own, before `c` who came later.
    a_can = True
    slots.free = 1
    adm.notify("m")
    await asyncio.wait_for(a, DEADLINE_S)
    slots.free = 1
    adm.notify("m")
    await asyncio.wait_for(c, DEADLINE_S)
    assert slots.admitted == ["b", "a", "c"] and adm.depth == 0


async def test_a_wake_up_nobody_can_use_is_tried_once_per_waiter_and_not_down_the_whole_queue() -> None:
    # A slot taken by a request that arrived meanwhile leaves every waiter without room: the wake-up is passed
    # on a bounded number of times (each try runs the scheduler), never back to a waiter that already failed.
    adm = Admission(100)
    slots = Slots()
    names = [f"w{i}" for i in range(PASS_ON_LIMIT + 5)]
    tasks = await _queue(adm, slots, *((n, lambda: True) for n in names))

    adm.notify("m")  # no slot free
    await wait_for(lambda: len(slots.tried) == PASS_ON_LIMIT + 1, DEADLINE_S, "the wake-up passed on")
    await _settle(adm)
    assert slots.tried == names[: PASS_ON_LIMIT + 1]
    assert adm.depth == len(names)

    # Still in arrival order afterwards.
    slots.free = 1
    adm.notify("m")
    await asyncio.wait_for(tasks[0], DEADLINE_S)
    assert slots.admitted == ["w0"]
    for t in tasks[1:]:
        t.cancel()
    await asyncio.gather(*tasks[1:], return_exceptions=True)
    assert adm.depth == 0


async def test_a_lone_waiter_that_cannot_use_a_wake_up_waits_again_without_spinning() -> None:
    adm = Admission(10)
    slots = Slots()
    (a,) = await _queue(adm, slots, ("a", lambda: True))
    adm.notify("m")
    await wait_for(lambda: slots.tried, DEADLINE_S, "a to look for room")
    await _settle(adm)
    assert slots.tried == ["a"] and not a.done()
    slots.free = 1
    adm.notify("m")
    await asyncio.wait_for(a, DEADLINE_S)
    assert slots.tried == ["a", "a"] and adm.depth == 0


async def test_a_waiter_cancelled_while_holding_a_wake_up_passes_it_on() -> None:
    # The client of `a` went away after its wake-up was sent but before it ran: `b` must get the slot.
    adm = Admission(10)
    slots = Slots()
    a, b = await _queue(adm, slots, ("a", lambda: True), ("b", lambda: True))
    slots.free = 1
    adm.notify("m")
    a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a
    await asyncio.wait_for(b, DEADLINE_S)
    assert slots.admitted == ["b"] and slots.tried == ["b"] and adm.depth == 0


async def test_room_for_several_admits_several_from_one_wake_up() -> None:
    # A new endpoint with free slots arrives as one notification (a snapshot, a scrape): every waiter that
    # fits goes in now, not one per later release or per scrape.
    adm = Admission(10)
    slots = Slots()
    tasks = await _queue(adm, slots, *((name, lambda: True) for name in "abcd"))
    slots.free = 3
    adm.notify("m")
    await asyncio.wait_for(asyncio.gather(*tasks[:3]), DEADLINE_S)
    await _settle(adm)
    assert slots.admitted == ["a", "b", "c"] and not tasks[3].done() and adm.depth == 1
    assert slots.tried == ["a", "b", "c", "d"]  # `d` looked once, found no room, and waits on
    slots.free = 1
    adm.notify("m")
    await asyncio.wait_for(tasks[3], DEADLINE_S)
