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

__all__ = ["Admission"]


class Admission:
    def __init__(self, queue_size: int, on_reject: Callable[[str], None] | None = None) -> None:
        self.queue_size = queue_size
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self._depth = 0
        self._on_reject = on_reject

    @property
    def depth(self) -> int:
        return self._depth

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
        """Return once `has_room()` is true for this request, in arrival order; raise a 429 ApiError otherwise."""
        if self._depth >= self.queue_size:
            raise self._reject(
                "queue_full", f"The admission queue is full ({self.queue_size} waiting); retry shortly.", 1
            )
        queue = self._waiters.setdefault(model, deque())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        self._depth += 1
        fut: asyncio.Future[None] = loop.create_future()
        queue.append(fut)
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
                        await fut
                except TimeoutError:
                    continue
                if has_room():
                    admitted = True
                    return
                fut = loop.create_future()  # woken but beaten to the slot: wait again at the front
                queue.appendleft(fut)
        finally:
            self._depth -= 1
            if fut in queue:
                queue.remove(fut)
            if not queue:
                self._waiters.pop(model, None)
            elif not admitted and fut.done() and not fut.cancelled():
                self.notify(model)  # pass on a wake-up this request did not use

    def notify(self, model: str) -> None:
        """Room may have appeared for `model`: wake its first waiter."""
        queue = self._waiters.get(model)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def notify_all(self) -> None:
        for model in list(self._waiters):
            self.notify(model)
