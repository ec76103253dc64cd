"""The revision history's writer: the records the store has not taken yet, written in order, retried until written.

A write that fails (the store down) is queued and retried in order until it lands: the history must not silently
miss a revision the fleet ran. Each record keeps its id, so a retry is written once. A store down for days fills
the queue: the oldest records go first, said in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from llmgw.core.words import short
from llmgw.store.errors import StoreError
from llmgw.store.records import Revision
from llmgw.store.store import Store

log = logging.getLogger("llmgw.controller")

__all__ = ["REVISION_QUEUE_MAX", "RevisionHistory"]

REVISION_QUEUE_MAX = 10_000
REVISION_RETRY_FIRST_S = 0.5
REVISION_RETRY_MAX_S = 30.0


class RevisionHistory:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.pending: deque[Revision] = deque(maxlen=REVISION_QUEUE_MAX)  # oldest first
        self.write_error: str | None = None  # the store's last refusal, until a write lands
        self._retry: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def record(self, revision: Revision) -> None:
        """Write `revision` after every record still queued; queued (and retried) when the store refuses."""
        if len(self.pending) == REVISION_QUEUE_MAX:
            lost = self.pending[0]
            log.error(
                "revision history queue full: dropping the oldest unwritten record (%s by %s at %s)",
                short(lost.sha),
                lost.applied_by,
                lost.applied_at,
            )
        behind = bool(self.pending)
        self.pending.append(revision)
        if behind:  # the retry is writing older records: this one goes after them, without waiting here
            self._start_retry()
            return
        if not await self.flush():
            log.warning(
                "could not record revision %s in the store; %d record(s) queued, retrying",
                short(revision.sha),
                len(self.pending),
            )
            self._start_retry()

    async def flush(self) -> bool:
        """Write queued history records, oldest first; False (the rest kept) when the store refuses."""
        async with self._lock:  # one writer: two would write the head twice and drop the next
            while self.pending:
                try:
                    await self.store.record_revision(self.pending[0])
                except StoreError as exc:
                    self.write_error = str(exc)
                    return False
                self.pending.popleft()
            self.write_error = None
            return True

    def _start_retry(self) -> None:
        if self._retry is not None and not self._retry.done():
            return
        self._retry = asyncio.get_running_loop().create_task(
            self._retry_writes(), name="llmgw-revision-retry"
        )

    async def _retry_writes(self) -> None:
        delay = REVISION_RETRY_FIRST_S
        while not await self.flush():
            await asyncio.sleep(delay)
            delay = min(delay * 2, REVISION_RETRY_MAX_S)
        log.info("revision history caught up with the store")

    async def close(self) -> None:
        """Stop the retry (a controller shutting down); what is still queued is said in the log."""
        task, self._retry = self._retry, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.pending:
            log.warning(
                "stopping with %d revision record(s) not written to the store: %s",
                len(self.pending),
                ", ".join(f"{short(r.sha)} by {r.applied_by}" for r in self.pending),
            )
