"""The batched usage writer: off the request path, nothing lost across a store outage, flushed on close."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from support import wait_for

from llmgw.store import Store, StoreUnavailable, UsageRecord
from llmgw.store.usage.usage_spool import decode
from llmgw.store.usage.usage_writer import UsageWriter

from .fakes import FakeStore


def rec(i: int, project: str = "p") -> UsageRecord:
    return UsageRecord(
        time=float(i),
        request_id=f"r{i}",
        project=project,
        model="m",
        status=200,
        tokens_in=i,
        tokens_out=2 * i,
        cost=0.001,
    )


async def test_batches_by_size_and_by_time() -> None:
    fake = FakeStore()
    writer = UsageWriter(fake, batch_size=10, flush_interval=0.05)
    await writer.start()
    for i in range(25):
        writer.record(rec(i))
    # 2 full batches, then the rest on the timer
    await wait_for(lambda: len(fake.usage) == 25, 10, "25 records stored")
    assert writer.stats.written == 25 and writer.stats.pending == 0
    await writer.close()


async def test_nothing_lost_across_an_outage() -> None:
    fake = FakeStore(down=True)
    writer = UsageWriter(fake, batch_size=10, flush_interval=0.01, retry_initial=0.01, retry_max=0.05)
    await writer.start()
    for i in range(100):
        writer.record(rec(i))
    await wait_for(lambda: writer.stats.failures >= 3, 10, "3 failed flushes")
    assert fake.usage == {} and writer.stats.pending == 100
    fake.down = False
    await wait_for(lambda: len(fake.usage) == 100, 10, "100 records stored")
    assert sum(r.tokens_in for r in fake.usage.values()) == sum(range(100))
    assert writer.stats.dropped == 0
    await writer.close()


async def test_close_flushes_what_is_left() -> None:
    fake = FakeStore()
    writer = UsageWriter(fake, batch_size=1000, flush_interval=3600)
    await writer.start()
    for i in range(7):
        writer.record(rec(i))
    await writer.close()
    assert len(fake.usage) == 7


async def test_bounded_memory_drops_and_counts_past_the_bound() -> None:
    fake = FakeStore(down=True)
    writer = UsageWriter(fake, batch_size=2, max_pending=5)
    for i in range(8):
        writer.record(rec(i))
    assert writer.stats.pending == 5 and writer.stats.dropped == 3
    fake.down = False
    await writer.flush()
    assert sorted(r.request_id for r in fake.usage.values()) == [f"r{i}" for i in range(5)]


async def test_usage_totals_match_the_requests_made(store: Store) -> None:
    writer = UsageWriter(store, batch_size=16, flush_interval=0.02)
    await writer.start()
    for i in range(50):
        writer.record(rec(i, project="a" if i % 3 else "b"))
    await writer.close()
    totals = await store.usage_totals("project")
    assert sum(t.requests for t in totals) == 50
    assert sum(t.tokens_in for t in totals) == sum(range(50))
    assert sum(t.tokens_out for t in totals) == 2 * sum(range(50))


@pytest.mark.postgres
async def test_nothing_lost_when_postgresql_stops_and_starts(pg_server, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    if not pg_server.controllable:
        pytest.skip("an external PostgreSQL (LLMGW_TEST_PG_DSN) is not ours to stop")
    store = await Store.open(pg_dsn)
    writer = UsageWriter(store, batch_size=5, flush_interval=0.02, retry_initial=0.05, retry_max=0.2)
    await writer.start()
    try:
        for i in range(10):
            writer.record(rec(i))
        await wait_for(lambda: writer.stats.written == 10, 10, "10 records written")
        await asyncio.to_thread(pg_server.stop)
        for i in range(10, 40):
            writer.record(rec(i))
        await wait_for(lambda: writer.stats.failures >= 2, 10, "2 failed flushes")
        await asyncio.to_thread(pg_server.start)
        await wait_for(lambda: writer.stats.written == 40, 30, "all 40 records written")
    finally:
        await writer.close()
    rows = await store.list_usage()
    await store.close()
    assert sorted(r.request_id for r in rows) == sorted(f"r{i}" for i in range(40))


async def test_the_spool_gets_one_step_of_records_in_one_write_before_the_loop_waits_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = UsageWriter(FakeStore(), batch_size=1000, flush_interval=60, spool_dir=tmp_path)
    await writer.start()
    writes: list[int] = []
    real_write = os.write

    def counted(fd: int, data: bytes) -> int:
        writes.append(data.count(b"\n"))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counted)
    recs = [rec(i) for i in range(6)]
    for r in recs[:5]:
        writer.record(r)
    assert writes == []  # still this step: buffered
    await asyncio.sleep(0)  # the loop's next step: written, before any wait for I/O
    assert writes == [5]
    [segment] = _segments(tmp_path)
    assert [decode(line) for line in segment.read_bytes().splitlines()] == recs[:5]
    writer.record(recs[5])
    await writer.close()  # what is buffered at close is written (and then, all stored, removed)
    assert writes == [5, 1] and not _segments(tmp_path)


def _segments(directory: Path) -> list[Path]:
    return list(directory.glob("usage-*.jsonl"))


def test_a_writer_outside_a_loop_spools_at_once(tmp_path: Path) -> None:
    writer = UsageWriter(FakeStore(), spool_dir=tmp_path)
    assert writer._spool is not None
    writer._spool.open()
    one = rec(1)
    writer.record(one)
    [segment] = tmp_path.glob("usage-*.jsonl")
    assert decode(segment.read_bytes()) == one


class DownThenUp:
    """A usage sink the store behind is down for `down` writes, saying to try again at once."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.attempts = 0
        self.usage: list[UsageRecord] = []

    async def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        self.attempts += 1
        if self.attempts <= self.down:
            raise StoreUnavailable("the store is restarting", delay=0.0)
        self.usage.extend(records)


async def test_a_failed_write_is_retried_after_the_delay_the_store_gives() -> None:
    sink = DownThenUp(down=3)
    # The writer's own backoff is an hour: only the store's delay (none) brings the retries this soon.
    writer = UsageWriter(sink, batch_size=10, flush_interval=0.01, retry_initial=3600, retry_max=3600)
    await writer.start()
    for i in range(5):
        writer.record(rec(i))
    await wait_for(lambda: len(sink.usage) == 5, 10, "the 5 records written after 3 refusals")
    assert sink.attempts == 4 and writer.stats.failures == 3
    await writer.close()


class HeldSink:
    """A usage sink whose writes wait until `go` is set: a batch caught in flight."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.writing = 0
        self.usage: list[UsageRecord] = []

    async def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        self.writing += 1
        await self.go.wait()
        self.usage.extend(records)


async def test_a_flush_while_the_background_batch_is_in_flight_writes_each_record_once() -> None:
    sink = HeldSink()
    writer = UsageWriter(sink, batch_size=10, flush_interval=3600)
    await writer.start()
    for i in range(10):  # a full batch: the background task takes it and waits in the store
        writer.record(rec(i))
    await wait_for(lambda: sink.writing == 1, 10, "the background batch in flight")
    flushing = asyncio.create_task(writer.flush())
    await asyncio.sleep(0)
    for i in range(10, 13):
        writer.record(rec(i))
    sink.go.set()
    await asyncio.wait_for(flushing, 10)
    await wait_for(lambda: writer.stats.pending == 0, 10, "every record written")
    assert sorted(r.request_id for r in sink.usage) == sorted(f"r{i}" for i in range(13))
    assert writer.stats.written == 13
    await writer.close()
