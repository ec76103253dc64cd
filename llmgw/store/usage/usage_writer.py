"""Usage records written in batches, off the request path.

`record()` only appends to memory and never waits; a background task writes a batch when `batch_size`
records are waiting or `flush_interval` seconds have passed. When the store fails the batch stays in memory
(bounded by `max_pending`) and is retried with backoff, so a brief outage loses nothing; inserts are
idempotent (each record carries its own id), so a batch whose commit reply was lost is not counted twice.
`close()` flushes what is left before returning.

With `spool_dir` every record is also appended to a local spool (llmgw.store.usage.usage_spool) at the end of the
event loop's step that recorded it (the records of one step in one write(2), not a system call per request),
and the spool left by a killed process is written first at `start()`: SIGKILL loses no record but those of
the step it interrupted, a machine crash at most those since the last fsync (once per flush, before each
batch goes to the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from llmgw.core.errors import Outage, retry_after
from llmgw.store.errors import StoreError
from llmgw.store.records import UsageRecord
from llmgw.store.usage.usage_spool import UsageSpool, fsync_file

log = logging.getLogger(__name__)


class UsageInserter(Protocol):
    async def insert_usage(self, records: Sequence[UsageRecord]) -> None: ...


@dataclass(frozen=True)
class WriterStats:
    pending: int
    written: int
    dropped: int  # only when more than max_pending records waited through a long outage
    failures: int


class UsageWriter:
    def __init__(
        self,
        sink: UsageInserter,
        *,
        batch_size: int = 200,
        flush_interval: float = 1.0,
        max_pending: int = 100_000,
        retry_initial: float = 0.2,
        retry_max: float = 5.0,
        spool_dir: Path | None = None,
    ) -> None:
        if batch_size < 1 or max_pending < batch_size:
            raise ValueError(f"batch_size must be >= 1 and <= max_pending, got {batch_size}, {max_pending}")
        self._sink = sink
        self._batch_size = batch_size
        self._interval = flush_interval
        self._max_pending = max_pending
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._pending: deque[UsageRecord] = deque()
        self._spool = UsageSpool(spool_dir) if spool_dir is not None else None
        self._segments: deque[int] = deque()  # with a spool: the segment of each pending record
        self._spool_write_due = False  # a call to _write_spool is scheduled
        self._wake = asyncio.Event()
        self._batch_lock = asyncio.Lock()  # one batch in flight (_write_one_batch)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()  # cuts a retry back-off short at shutdown
        self._written = 0
        self._dropped = 0
        self._failures = 0

    @property
    def stats(self) -> WriterStats:
        return WriterStats(len(self._pending), self._written, self._dropped, self._failures)

    def record(self, rec: UsageRecord) -> None:
        """Queue one record; never blocks. Past `max_pending` the new record is dropped (and counted):
        the oldest may be in a batch being written right now."""
        if len(self._pending) >= self._max_pending:
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                log.error(
                    "usage writer full (%d waiting): %d records dropped", self._max_pending, self._dropped
                )
            return
        if self._spool is not None:
            self._segments.append(self._spool.buffer(rec))
            if not self._spool_write_due:
                self._spool_write_due = True
                try:
                    asyncio.get_running_loop().call_soon(self._write_spool)
                except RuntimeError:  # no loop (a synchronous caller): write at once
                    self._write_spool()
        self._pending.append(rec)
        if len(self._pending) >= self._batch_size:
            self._wake.set()

    def _write_spool(self) -> None:
        self._spool_write_due = False
        if self._spool is not None:
            self._spool.write_buffered()

    async def start(self) -> None:
        """Open the spool (raises SpoolError when another router holds it) and queue what it holds, then
        start writing in the background."""
        if self._spool is not None and self._task is None:
            left = self._spool.open()
            self._pending.extendleft(rec for rec, _ in reversed(left))
            self._segments.extendleft(seq for _, seq in reversed(left))
            if self._pending:
                self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="llmgw-usage-writer")

    async def flush(self) -> None:
        """Write everything waiting now (raises if the store fails; the records stay queued)."""
        while self._pending:
            await self._write_one_batch()

    async def close(self, flush_within: float = 10.0) -> None:
        """Stop the background task and flush what is left, retrying for up to `flush_within` seconds."""
        self._closing = True
        self._closed.set()
        if self._task is not None:
            # Not Task.cancel(): asyncio.wait_for in 3.11 can swallow a cancel that races a set event, and
            # the loop would then run on forever. A flag the loop checks cannot be lost.
            self._wake.set()
            await self._task
            self._task = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_within
        delay = self._retry_initial
        while self._pending:
            try:
                await self._write_one_batch()
            except StoreError:
                if loop.time() + delay > deadline:
                    log.error("usage writer closing with %d records unwritten", len(self._pending))
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max)
        if self._spool is not None:
            self._spool.close(everything_written=not self._pending)

    async def _write_one_batch(self) -> None:
        # One batch in flight at a time: flush() (or close()) beside the background task would otherwise take
        # the same records, and each would then remove its batch's count from the queue, dropping records
        # that were never written.
        async with self._batch_lock:
            if not self._pending:
                return
            batch = [self._pending[i] for i in range(min(self._batch_size, len(self._pending)))]
            try:
                await self._sink.insert_usage(batch)
            except StoreError:
                self._failures += 1
                raise
            # Written: remove exactly those (new records were only appended behind them meanwhile).
            for _ in batch:
                self._pending.popleft()
            self._written += len(batch)
            if self._spool is not None:
                for _ in batch:
                    self._segments.popleft()
                self._spool.release(self._segments[0] if self._segments else None)

    async def _run(self) -> None:
        delay = self._retry_initial  # the writer's own backoff, doubled each failure up to retry_max
        failing = Outage(log, "usage write")  # the records are kept meanwhile, none dropped
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return  # close() writes what is left, with its own deadline
            if self._spool is not None:
                # The records about to be sent are on disk first, fsynced off the event loop.
                closed = self._spool.rotate()
                if closed is not None:
                    await asyncio.to_thread(fsync_file, closed)
            try:
                while self._pending:
                    await self._write_one_batch()
                    if len(self._pending) < self._batch_size:
                        break
                delay = self._retry_initial
                failing.recovered()
            except Exception as exc:  # kept and retried, never dropped: a bug here must not lose usage
                # The store's own delay when it says one (StoreUnavailable is transient), else the backoff.
                wait = retry_after(exc, default=delay, most=self._retry_max)
                failing.failed(exc, wait)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._closed.wait()
                delay = min(delay * 2, self._retry_max)
                self._wake.set()
