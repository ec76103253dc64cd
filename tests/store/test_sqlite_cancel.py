"""The store's SQLite connection. A caller's timeout cancels the task that awaits a SQLite statement, not the
statement: it keeps running in the store's one worker thread. These pin that such a cancel never leaves the
connection inside a transaction (every later BEGIN would fail), that closing never joins the worker on the event
loop thread, and that SQLite's temporary files stay in memory."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from support import wait_for

from llmgw.store import Store
from llmgw.store.db import SqliteBackend


async def test_a_transaction_cancelled_while_its_begin_runs_leaves_the_store_usable(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = await Store.open(f"sqlite:///{path}")
    try:
        backend = store.db
        assert isinstance(backend, SqliteBackend) and backend._conn is not None
        begun = threading.Event()
        backend._conn.set_trace_callback(lambda sql: begun.set() if sql.startswith("BEGIN") else None)
        # Another connection holds the write lock, so our BEGIN IMMEDIATE is running (waiting on it) in the
        # thread when its awaiting task is cancelled, as an `asyncio.timeout` around a store call does.
        other = sqlite3.connect(str(path), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(store.acquire_lease("l", "me@a", 15.0, 1000.0))
        await asyncio.to_thread(begun.wait, 10.0)
        assert begun.is_set(), "BEGIN IMMEDIATE never started in the SQLite thread"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        other.execute("ROLLBACK")  # our BEGIN now succeeds in the thread, after its caller gave up
        other.close()
        result = await store.acquire_lease("l", "me@a", 15.0, 1000.0)
        assert result.held and result.current is not None and result.current.holder == "me@a"
        assert not backend._conn.in_transaction
    finally:
        await store.close()


async def test_close_does_not_join_the_sqlite_worker_on_the_event_loop(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 's.db'}")
    backend = store.db
    assert isinstance(backend, SqliteBackend)
    release, finished = threading.Event(), threading.Event()
    ticks = 0

    def busy(_: sqlite3.Connection) -> None:
        release.wait(30.0)
        finished.set()

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    beat = asyncio.create_task(heartbeat())
    try:
        # A job queued behind close()'s own (a read that raced the stop) keeps the worker busy.
        closing = asyncio.create_task(store.close())
        late = asyncio.create_task(backend.call(busy))
        await closing
        assert not finished.is_set(), "close() waited on the event loop thread for the worker's last job"
        seen = ticks
        # The loop still runs while the worker is busy.
        await wait_for(lambda: ticks > seen + 3, 10.0, "the event loop to keep running after close()")
    finally:
        release.set()
        beat.cancel()
        await asyncio.gather(beat, late, return_exceptions=True)


async def test_the_store_keeps_sqlite_temporary_files_in_memory(tmp_path: Path) -> None:
    # A usage batch's multi-row INSERTs each keep a statement journal: on disk, one file created, written
    # hundreds of times and deleted per batch (llmgw/store/db.py).
    store = await Store.open(f"sqlite:///{tmp_path / 's.db'}")
    try:
        backend = store.db
        assert isinstance(backend, SqliteBackend) and backend._conn is not None
        assert backend._conn.execute("PRAGMA temp_store").fetchone() == (2,)  # 2: MEMORY
    finally:
        await store.close()
