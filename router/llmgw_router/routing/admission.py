"""The admission queue: every wait of a request for its model, whether the model's replicas are busy or it has
none yet (an on-demand model loading, a scale-up), is one place in this queue.

Waiting in the router rather than in an engine's queue keeps the choice of endpoint late, made on fresh
readings. Each model has its own queue (`fairqueue.FairQueue`: priority bands, fair shares over projects, FIFO
within a project); the queues are bounded per model and in total. A full queue is a 429 `queue_full` (unless
the request outranks someone waiting, who is displaced instead); a wait past its deadline is what the caller's
`expired` says (forwarding: 429 `queue_timeout`, or 503 `model_loading` while the model has no replica).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from llmgw_router.decisions.fairqueue import Band, Entry, FairQueue, band_of
from llmgw_router.server.errors import ApiError

__all__ = ["DEFAULT_BAND", "PASS_ON_LIMIT", "Admission"]

# How many times a wake-up the woken waiter could not use is passed on down the queue (so at most
# PASS_ON_LIMIT + 1 waiters try it) before it is dropped. Each try runs the scheduler, and
# a slot taken by a request that arrived meanwhile leaves nobody room: walking the whole queue for it would
# cost a scheduler run per waiter. A waiter that cannot use a slot is rare otherwise (a retry excluding the
# endpoint that freed up, a breaker refusing a second probe), so a few hops reach one that can.
PASS_ON_LIMIT = 4
DEFAULT_BAND = band_of(None, 0)


@dataclass(frozen=True, slots=True)
class _WakeUp:
    """Room may be there. `tried`: waiters that looked and found none for themselves (passed over when it
    is passed on); `left`: how many more times it may be passed on."""

    tried: tuple[Entry[_Waiter], ...] = ()
    left: int = PASS_ON_LIMIT


class _Waiter:
    """One queued request. It keeps its place while it waits again; `fut` is its current wake-up (an
    exception instead when it is displaced from a full queue)."""

    __slots__ = ("displaced", "fut")

    def __init__(self, fut: asyncio.Future[_WakeUp]) -> None:
        self.fut = fut
        self.displaced = False  # taken out of the queue already, to make room for a higher band


class Admission:
    def __init__(
        self,
        queue_size: int,
        on_reject: Callable[[str], None] | None = None,
        model_queue_size: int | None = None,
    ) -> None:
        self.queue_size = queue_size  # across every model
        self.model_queue_size = queue_size if model_queue_size is None else model_queue_size
        self._queues: dict[str, FairQueue[_Waiter]] = {}
        self._depth = 0
        self._on_reject = on_reject

    @property
    def depth(self) -> int:
        return self._depth

    def queued(self, model: str) -> int:
        """Requests waiting for `model` now (the load report's `queued`)."""
        queue = self._queues.get(model)
        return len(queue) if queue is not None else 0

    @property
    def wake_ups_pending(self) -> int:
        """Wake-ups handed to waiters that have not yet looked for room. 0: every queued request is parked
        until the next `notify` (the queue is quiet, which tests wait for instead of counting loop ticks)."""
        return sum(1 for e in self._entries() if e.item.fut.done())

    def _entries(self) -> Iterator[Entry[_Waiter]]:
        for queue in self._queues.values():
            yield from queue

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

    async def wait(
        self,
        model: str,
        has_room: Callable[[], bool],
        wait_seconds: float,
        *,
        project: str = "",
        band: Band = DEFAULT_BAND,
        share: float = 1.0,
        expired: Callable[[], ApiError | None] | None = None,
    ) -> None:
        """Return once `has_room()` is true for this request, in the queue's order; raise an ApiError when the
        queue is full or `wait_seconds` pass (`expired()` says which error; None, or no `expired`: a 429
        `queue_timeout`).

        `has_room` is per request (a retry excludes endpoints it failed on), so a woken waiter that cannot use
        the slot keeps its place and passes the wake-up to the next in order: a later request that could use
        the slot does not wait behind one that cannot. A cancelled wait (the client went away) leaves at once."""
        self._make_room(model, band)
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = FairQueue()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        me = queue.push(_Waiter(loop.create_future()), project, band, share)
        self._depth += 1
        admitted = False
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._expired(model, wait_seconds, expired)
                try:
                    async with asyncio.timeout(remaining):
                        wake = await me.item.fut
                except TimeoutError:
                    if me.item.fut.cancelled():  # by the timeout, which may fire a hair before the deadline
                        me.item.fut = loop.create_future()
                    continue
                if has_room():
                    admitted = True
                    return
                me.item.fut = loop.create_future()  # wait again, in the same place
                if wake.left > 0:
                    self._wake(queue, _WakeUp((*wake.tried, me), wake.left - 1))
        finally:
            if not me.item.displaced:
                self._leave(model, queue, me, admitted)

    def _leave(self, model: str, queue: FairQueue[_Waiter], me: Entry[_Waiter], admitted: bool) -> None:
        # An emptied queue is kept: its virtual times carry the shares into the next busy spell.
        self._depth -= 1
        if admitted:
            queue.served(me)
            # Room may be left for more than one (a new endpoint, several slots freed by one reading):
            # the next waiter looks too. Its wake-up may be passed on once more, so when no room is left
            # this costs at most two more scheduler runs, not a walk down the queue.
            self._wake(queue, _WakeUp((), 1))
            return
        queue.remove(me)
        if me.item.fut.done() and not me.item.fut.cancelled() and me.item.fut.exception() is None:
            # Leaving with a wake-up it did not use (timed out or cancelled meanwhile): pass it on.
            self._wake(queue, me.item.fut.result())

    def admitted(self, model: str, project: str, share: float) -> None:
        """A request for `model` got a slot without waiting (nobody was queued): charge its project too."""
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = FairQueue()
        queue.charge(project, share)

    def forget(self, models: Collection[str]) -> None:
        """Drop the empty queues of models no longer published (a new snapshot): memory stays bounded by the
        catalog."""
        for model in [m for m, q in self._queues.items() if not q and m not in models]:
            del self._queues[model]

    def _expired(self, model: str, waited: float, expired: Callable[[], ApiError | None] | None) -> ApiError:
        err = expired() if expired is not None else None
        if err is not None:
            if self._on_reject is not None:
                self._on_reject("loading")
            return err
        return self._reject(
            "timeout",
            f"No capacity for model {model!r} within {waited:g} s; retry shortly.",
            max(1, round(waited / 4)),
        )

    def _make_room(self, model: str, band: Band) -> None:
        """Refuse a request that finds its model's queue or the whole queue full, unless a waiter of a lower
        band is there to displace: the newest of the lowest band is answered 429 `queue_full` instead."""
        model_full = self.queued(model) >= self.model_queue_size
        if not model_full and self._depth < self.queue_size:
            return
        pool = [m for m in ([model] if model_full else list(self._queues)) if m in self._queues]
        victims = [(v, m) for m in pool if (v := self._queues[m].last_of_lowest_band()) is not None]
        victim, owner = max(victims, key=lambda vm: (vm[0].band, vm[0].seq), default=(None, ""))
        # A victim holding a wake-up is about to look for room: leave it be, refuse the newcomer.
        if victim is None or victim.band <= band or victim.item.fut.done():
            where = f"for model {model!r} ({self.model_queue_size})" if model_full else f"({self.queue_size})"
            raise self._reject("queue_full", f"The admission queue {where} is full; retry shortly.", 1)
        victim.item.displaced = True
        self._leave(owner, self._queues[owner], victim, admitted=False)
        victim.item.fut.set_exception(
            self._reject(
                "queue_full",
                "The admission queue is full and a request of a higher priority took this place; "
                "retry shortly.",
                1,
            )
        )

    @staticmethod
    def _wake(queue: FairQueue[_Waiter], wake: _WakeUp) -> None:
        """Wake the first waiter in the queue's order that neither holds a wake-up nor tried this one."""
        tried = wake.tried
        first = queue.first(skip=lambda e: e in tried, promised=lambda e: e.item.fut.done())
        if first is not None:
            first.item.fut.set_result(wake)

    def notify(self, model: str) -> None:
        """Room may have appeared for `model`: wake its first waiter not woken yet."""
        queue = self._queues.get(model)
        if queue:
            self._wake(queue, _WakeUp())

    def notify_all(self) -> None:
        for model in list(self._queues):
            self.notify(model)
