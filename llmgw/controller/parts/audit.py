"""The audit log's writer: every admin action that changes something, appended to the store.

`record` never waits for the store: the entry is queued and written by a task, retried oldest first with a
doubling delay while the store is down (as the revision history is, llmgw.controller.core), so a slow or
absent store neither blocks nor fails the action it records. Each entry keeps its id, so a retry is written
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from llmgw.store.errors import StoreError
from llmgw.store.records import AuditEntry
from llmgw.store.store import Store

log = logging.getLogger("llmgw.controller.parts.audit")

AUDIT_QUEUE_MAX = 10_000  # a store down for days: the oldest entries go first, said in the log
AUDIT_RETRY_FIRST_S = 0.5
AUDIT_RETRY_MAX_S = 30.0


class AuditLog:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.pending: deque[AuditEntry] = deque()
        self.write_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def record(self, entry: AuditEntry) -> None:
        """Queue `entry` and have it written; returns at once."""
        if len(self.pending) >= AUDIT_QUEUE_MAX:
            lost = self.pending.popleft()
            log.error(
                "audit queue full: dropping the oldest unwritten entry (%s %s by %s at %s)",
                lost.action,
                lost.object,
                lost.actor,
                lost.time,
            )
        self.pending.append(entry)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._write(), name="llmgw-audit-writer")

    async def flush(self) -> bool:
        """Write what is queued, oldest first; False (the rest kept) when the store refuses."""
        async with self._lock:
            while self.pending:
                try:
                    await self.store.record_audit(self.pending[0])
                except StoreError as exc:
                    if self.write_error is None:
                        log.warning(
                            "audit entries cannot be written to the store (%s); %d queued, retrying",
                            exc,
                            len(self.pending),
                        )
                    self.write_error = str(exc)
                    return False
                self.pending.popleft()
            if self.write_error is not None:
                log.info("audit log caught up with the store")
                self.write_error = None
            return True

    async def _write(self) -> None:
        delay = AUDIT_RETRY_FIRST_S
        while not await self.flush():
            await asyncio.sleep(delay)
            delay = min(delay * 2, AUDIT_RETRY_MAX_S)

    async def close(self) -> None:
        """Stop the writer after one last try; what is still queued is logged (and lost)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), timeout=2.0)
        for entry in self.pending:
            log.warning(
                "stopping with an audit entry not written to the store: %s %s by %s (%s) at %s",
                entry.action,
                entry.object,
                entry.actor,
                entry.outcome,
                entry.time,
            )
