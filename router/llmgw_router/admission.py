"""The bounded admission queue: requests wait here, in order, until their model has an endpoint with room.

Waiting in the router rather than in an engine's queue keeps the choice of endpoint late, made on fresh
readings. The queue is bounded across all models; a full queue or a wait past the timeout is a 429 with
Retry-After.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from llmgw_router.errors import ApiError

__all__ = ["PASS_ON_LIMIT", "Admission"]

# How many times a wake-up the woken waiter could not use is passed on down the queue (so at most
# PASS_ON_LIMIT + 1 waiters try it) before it is dropped. Each try runs the scheduler, and
# a slot taken by a request that arrived meanwhile leaves nobody room: walking the whole queue for it would
# cost a scheduler run per waiter. A waiter that cannot use a slot is rare otherwise (a retry excluding the
# endpoint that freed up, a breaker refusing a second probe), so a few hops reach one that can.
PASS_ON_LIMIT = 4


class _Waiter:
    """One queued request. It keeps its place in the queue while it waits again; `fut` is its current
    wake-up, whose result is how many waiters ahead of it had already turned that wake-up down."""

    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[int]) -> None:
        self.fut = fut


class Admission:
    def __init__(self, queue_size: int, on_reject: Callable[[str], None] | None = None) -> None:
        self.queue_size = queue_size
        self._waiters: dict[str, deque[_Waiter]] = {}
        self._depth = 0
        self._on_reject = on_reject

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def wake_ups_pending(self) -> int:
        """Wake-ups handed to waiters that have not yet looked for room. 0: every queued request is parked
        until the next `notify` (the queue is quiet, which tests wait for instead of counting loop ticks)."""
        return sum(1 for queue in self._waiters.values() for w in queue if w.fut.done())

    def _reject(self, reason: str, message: str, retry_after: int) -> ApiError:
        if self._on_reject is not None:
            self._on_reject(reason)
        return ApiError(
            429,
            message,
            "queue_full" if reason == "queue_full" else "queue_timeout",
            type_="rate_limit_error",
            headers={"Retry-After": str(retry_after)},
        )

    async def wait(self, model: str, has_room: Callable[[], bool], wait_seconds: float) -> None:
        """Return once `has_room()` is true for this request, in arrival order; raise a 429 ApiError otherwise.

        `has_room` is per request (a retry excludes endpoints it failed on), so a woken waiter that cannot use
        the slot keeps its place and passes the wake-up to the next waiter behind it: a later request that
        could use the slot does not wait behind one that cannot."""
        if self._depth >= self.queue_size:
            raise self._reject(
                "queue_full", f"The admission queue is full ({self.queue_size} waiting); retry shortly.", 1
            )
        queue = self._waiters.setdefault(model, deque())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        self._depth += 1
        me = _Waiter(loop.create_future())
        queue.append(me)
        admitted = False
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._reject(
                        "timeout",
                        f"No capacity for model {model!r} within {wait_seconds:g} s; retry shortly.",
                        max(1, round(wait_seconds / 4)),
                    )
                try:
                    async with asyncio.timeout(remaining):
                        refused = await me.fut
                except TimeoutError:
                    if me.fut.cancelled():  # by the timeout, which may fire a hair before the deadline
                        me.fut = loop.create_future()
                    continue
                if has_room():
                    admitted = True
                    return
                me.fut = loop.create_future()  # wait again, in the same place
                if refused < PASS_ON_LIMIT:
                    self._wake(queue, queue.index(me) + 1, refused + 1)
        finally:
            self._depth -= 1
            queue.remove(me)
            if not queue:
                self._waiters.pop(model, None)
            elif admitted:
                # Room may be left for more than one (a new endpoint, several slots freed by one reading):
                # the next waiter looks too. Its wake-up counts as passed on all but once already, so when
                # no room is left this costs at most two more scheduler runs, not a walk down the queue.
                self._wake(queue, 0, PASS_ON_LIMIT - 1)
            elif me.fut.done() and not me.fut.cancelled():
                # Leaving with a wake-up it did not use (timed out or cancelled meanwhile): pass it on.
                self._wake(queue, 0, me.fut.result())

    @staticmethod
    def _wake(queue: deque[_Waiter], start: int, refused: int) -> None:
        """Wake the first waiter from `start` on that does not hold a wake-up already."""
        for i in range(start, len(queue)):
            fut = queue[i].fut
            if not fut.done():
                fut.set_result(refused)
                return

    def queued(self, model: str) -> int:
        """Requests waiting for `model` now (the load report's `queued`)."""
        return len(self._waiters.get(model, ()))

    def notify(self, model: str) -> None:
        """Room may have appeared for `model`: wake its first waiter not woken yet."""
        queue = self._waiters.get(model)
        if queue:
            self._wake(queue, 0, 0)

    def notify_all(self) -> None:
        for model in list(self._waiters):
            self.notify(model)
