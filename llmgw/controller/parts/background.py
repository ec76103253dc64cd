"""The controller's short background work: a task set that keeps every task referenced until it ends, and
cancels and awaits what is left when its owner stops (no task floats, none is collected half-way)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("llmgw.controller")


class Background:
    """`spawn(coro)` runs it as a task owned here; `close()` cancels the ones still running and awaits them.

    A task spawned with a `key` is also found under it in `named` while it runs (one per key: the node loop
    keeps one attempt per node). A task that fails is logged, not left to the collector to mention."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tasks: set[asyncio.Task[Any]] = set()
        self.named: dict[str, asyncio.Task[Any]] = {}

    def spawn(self, coro: Coroutine[Any, Any, Any], *, key: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"llmgw-{self.name}-{key or 'task'}")
        self.tasks.add(task)
        if key is not None:
            self.named[key] = task
        task.add_done_callback(lambda t: self._done(t, key))
        return task

    def _done(self, task: asyncio.Task[Any], key: str | None) -> None:
        self.tasks.discard(task)
        if key is not None and self.named.get(key) is task:
            del self.named[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self.tasks)

    async def settle(self, within: float) -> None:
        """Wait, at most `within` seconds, for the tasks running now to end on their own (what is left is for
        close() to cancel)."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=within)

    async def close(self) -> None:
        """Cancel what still runs and wait for each to end (a task's own cleanup included)."""
        while self.tasks:
            running = list(self.tasks)
            for task in running:
                task.cancel()
            for task in running:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                self.tasks.discard(task)
        # Their done callbacks run on a later turn of the loop: what close() returns to is already clean.
        for key, task in list(self.named.items()):
            if task.done():
                del self.named[key]
