"""The two database backends behind one small async interface.

Every query in the store is written once, with `?` placeholders; the PostgreSQL backend rewrites them to
psycopg's `%s` in `_to_pyformat`, the only place the dialects differ at run time. SQLite runs in one worker
thread (sqlite3 connections are not safe to share between threads, and one writer is all SQLite allows
anyway); PostgreSQL uses one psycopg async connection, reopened after the server goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import psycopg

from llmgw.store.errors import StoreError, StoreUnavailable

Dialect = Literal["sqlite", "postgres"]
Params = Sequence[Any]
Row = tuple[Any, ...]
T = TypeVar("T")

DEFAULT_STATE_DIR = Path(".llmgw") / "state"
DEFAULT_DSN = f"sqlite:///{DEFAULT_STATE_DIR / 'llmgw.db'}"


@dataclass(frozen=True)
class Dsn:
    dialect: Dialect
    target: str  # a filesystem path for SQLite, a libpq conninfo/URL for PostgreSQL

    def redacted(self) -> str:
        """The DSN without a password, for messages and logs."""
        if self.dialect == "sqlite":
            return f"sqlite:///{self.target}"
        try:
            info = psycopg.conninfo.conninfo_to_dict(self.target)
        except psycopg.ProgrammingError:
            return "postgresql://(unparseable)"
        info.pop("password", None)
        host = info.get("host", "")
        return f"postgresql://{info.get('user', '')}@{host}:{info.get('port', '')}/{info.get('dbname', '')}"


def shareable_dsn(dsn: Dsn, configured: str | None = None) -> str:
    """A DSN another process can open, without a password: an `@file` reference as `configured` (the DSN
    stays in the file); a SQLite file's absolute path; a PostgreSQL conninfo with the password left out
    (libpq's PGPASSWORD or ~/.pgpass supplies it)."""
    if configured is not None and configured.strip().startswith("@"):
        return "@" + str(Path(configured.strip()[1:]).expanduser().resolve())
    if dsn.dialect == "sqlite":
        return f"sqlite:///{Path(dsn.target).expanduser().resolve()}"
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn.target)
    except psycopg.ProgrammingError as exc:
        raise StoreError(f"store DSN {dsn.redacted()} cannot be read: {exc}") from exc
    info.pop("password", None)
    rest = {k: str(v) for k, v in info.items() if v is not None}
    user, host, port, dbname = (rest.pop(k, "") for k in ("user", "host", "port", "dbname"))
    if "/" in host or "," in host:  # a socket directory or several hosts: libpq reads them from the query
        rest["host"], host = host, ""
    if port and not host:
        rest["port"], port = port, ""
    netloc = (urllib.parse.quote(user) + "@" if user else "") + host + (f":{port}" if port else "")
    query = "?" + urllib.parse.urlencode(rest) if rest else ""
    return f"postgresql://{netloc}/{urllib.parse.quote(dbname)}{query}"


def parse_dsn(text: str) -> Dsn:
    """`postgresql://...`/`postgres://...` is PostgreSQL; `sqlite:///path`, `sqlite://path` or a path is SQLite.

    `@/path/to/file` reads the DSN from that file, so a password stays out of flags and shell history.
    """
    text = text.strip()
    if not text:
        raise StoreError("empty store DSN: expected sqlite:///path/to/file.db, a path, or postgresql://...")
    if text.startswith("@"):
        source = Path(text[1:])
        try:
            return parse_dsn(source.read_text(encoding="utf-8"))
        except OSError as exc:
            raise StoreError(f"cannot read the store DSN from {source}: {exc.strerror}") from exc
    if text.startswith(("postgresql://", "postgres://")):
        return Dsn("postgres", text)
    if text.startswith("sqlite://"):
        rest = text[len("sqlite://") :]
        # SQLAlchemy's convention: sqlite:///rel/file.db is relative, sqlite:////abs/file.db is absolute.
        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise StoreError(f"store DSN {text!r} names no file: expected sqlite:///path/to/file.db")
        return Dsn("sqlite", path)
    if "://" in text:
        raise StoreError(
            f"unknown store DSN scheme in {text.split('://')[0]!r}: use sqlite:/// or postgresql://"
        )
    return Dsn("sqlite", text)


class Tx(Protocol):
    """One transaction: statements run in order and commit together."""

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]: ...
    async def execute(self, sql: str, params: Params = ()) -> int: ...
    async def executemany(self, sql: str, rows: Sequence[Params]) -> None: ...
    async def end_if_client_silent(self, seconds: float) -> None:
        """For a transaction that takes a lock other controllers wait on: if its client goes silent for
        `seconds` inside it (its network cut mid-transaction), the server ends it and frees the lock."""


class Backend(Protocol):
    dialect: Dialect
    dsn: Dsn

    def tx(self) -> contextlib.AbstractAsyncContextManager[Tx]: ...
    async def run_in_tx(self, statements: Sequence[tuple[str, Params]]) -> None:
        """Run writes in one transaction, in one trip to the database (no reads between them)."""

    async def close(self) -> None: ...


def row_chunks(rows: Sequence[T], most: int) -> Iterator[Sequence[T]]:
    """`rows` in chunks of `most` (a power of two), the rest in chunks of falling powers of two, for
    multi-row statements: each shape is compiled once (SQLite's statement cache, psycopg's prepared
    statements) and a batch of any size uses at most log2(most) + 1 shapes, all cached after the first few
    batches. A statement per batch size was compiled anew at each size not seen lately, which cost about
    as much as inserting its rows."""
    i, size = 0, most
    while i < len(rows):
        while len(rows) - i < size:
            size //= 2
        yield rows[i : i + size]
        i += size


def _to_pyformat(sql: str) -> str:
    """`?` placeholders to psycopg's `%s` (a literal `%` must then be doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


# ---------------------------------------------------------------------------------------------- SQLite


class _SqliteTx:
    def __init__(self, backend: SqliteBackend) -> None:
        self._b = backend

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        def run(conn: sqlite3.Connection) -> list[Row]:
            return [tuple(r) for r in conn.execute(sql, tuple(params)).fetchall()]

        return await self._b.call(run)

    async def execute(self, sql: str, params: Params = ()) -> int:
        return await self._b.call(lambda conn: conn.execute(sql, tuple(params)).rowcount)

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        await self._b.call(lambda conn: conn.executemany(sql, [tuple(r) for r in rows]))

    async def end_if_client_silent(self, seconds: float) -> None:
        # SQLite's locks live in the one process that holds them: a silent client is a dead process, and
        # its locks went with it.
        return None


class SqliteBackend:
    dialect: Dialect = "sqlite"

    def __init__(self, dsn: Dsn) -> None:
        self.dsn = dsn
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmgw-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    def _connect(self) -> sqlite3.Connection:
        path = Path(self.dsn.target)
        if str(path) != ":memory:":
            path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so every transaction is explicit.
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_mode = WAL")  # readers (the CLI) do not block the writer
        conn.execute("PRAGMA busy_timeout = 10000")
        # A multi-row INSERT inside a transaction keeps a statement journal (to undo just that statement), and
        # SQLite spills it to a file in /var/tmp: every usage batch created, wrote (about 660 pwrites a batch
        # of 200 rows, 4 system calls a request under load) and deleted one. In memory it costs a batch's pages.
        conn.execute("PRAGMA temp_store = MEMORY")
        return conn

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            if self._conn is None:
                self._conn = self._connect()
            return fn(self._conn)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, run)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"SQLite store {self.dsn.target}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"SQLite store {self.dsn.target}: {exc}") from exc

    @contextlib.asynccontextmanager
    async def tx(self) -> AsyncIterator[Tx]:
        # A cancelled awaiter (a caller's timeout) does not stop a statement already running in the SQLite
        # thread: a BEGIN that ran after its task was cancelled would leave the connection inside a
        # transaction, and every later BEGIN fails. So BEGIN, COMMIT and ROLLBACK are shielded (once sent they
        # finish), and any exit that is not a clean COMMIT rolls back whatever transaction is open. The one
        # worker thread runs jobs in order, so the rollback lands after the statement it undoes.
        async with self._lock:
            try:
                # BEGIN IMMEDIATE takes the write lock up front, so two processes never both read then write.
                await asyncio.shield(self.call(lambda c: c.execute("BEGIN IMMEDIATE")))
                yield _SqliteTx(self)
                await asyncio.shield(self.call(lambda c: c.execute("COMMIT")))
            except BaseException:
                with contextlib.suppress(StoreError):
                    await asyncio.shield(self.call(_rollback_if_open))
                raise

    async def run_in_tx(self, statements: Sequence[tuple[str, Params]]) -> None:
        # One hop to the SQLite thread for the whole transaction instead of one per statement: each hop is
        # a thread wake-up and a GIL hand-off that the event loop pays for too.
        def run(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    conn.execute(sql, tuple(params))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        async with self._lock:
            await self.call(run)

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        async with self._lock:
            await asyncio.get_running_loop().run_in_executor(self._pool, shut)
        # Never join the worker on the event loop thread (a job queued after `shut` would block the loop,
        # where no timeout can reach it): the worker ends by itself once its queue is drained.
        self._pool.shutdown(wait=False)


def _rollback_if_open(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


# ---------------------------------------------------------------------------------------------- PostgreSQL


class _PgTx:
    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        cur = await self._conn.execute(_to_pyformat(sql), tuple(params))
        return [tuple(r) for r in await cur.fetchall()]

    async def execute(self, sql: str, params: Params = ()) -> int:
        cur = await self._conn.execute(_to_pyformat(sql), tuple(params))
        return cur.rowcount

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        async with self._conn.cursor() as cur:
            await cur.executemany(_to_pyformat(sql), [tuple(r) for r in rows])

    async def end_if_client_silent(self, seconds: float) -> None:
        # Without it a client cut off between a statement and its COMMIT leaves its session idle in the
        # transaction, holding its locks until the server's TCP gives up (hours by default). Local to this
        # transaction: a long `store move` may rightly sit idle in its own while it reads the next page.
        await self._conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
            (f"{round(seconds * 1000)}",),
        )


class PostgresBackend:
    dialect: Dialect = "postgres"

    def __init__(self, dsn: Dsn, connect_timeout: float = 5.0) -> None:
        self.dsn = dsn
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._connect_timeout = connect_timeout

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.dsn.target, autocommit=True, connect_timeout=max(1, int(self._connect_timeout))
                )
            except psycopg.Error as exc:
                raise StoreUnavailable(f"PostgreSQL store {self.dsn.redacted()}: {exc}") from exc
        return self._conn

    @contextlib.asynccontextmanager
    async def tx(self) -> AsyncIterator[Tx]:
        async with self._lock:
            conn = await self._connection()
            try:
                async with conn.transaction():
                    yield _PgTx(conn)
            except psycopg.OperationalError as exc:
                # The server went away: drop the connection so the next call reconnects.
                await self._drop()
                raise StoreUnavailable(f"PostgreSQL store {self.dsn.redacted()}: {exc}") from exc
            except psycopg.Error as exc:
                if conn.closed or conn.broken:
                    await self._drop()
                    raise StoreUnavailable(f"PostgreSQL store {self.dsn.redacted()}: {exc}") from exc
                raise StoreError(f"PostgreSQL store {self.dsn.redacted()}: {exc}") from exc

    async def run_in_tx(self, statements: Sequence[tuple[str, Params]]) -> None:
        async with self.tx() as tx:
            for sql, params in statements:
                await tx.execute(sql, params)

    async def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    async def close(self) -> None:
        async with self._lock:
            await self._drop()


def open_backend(dsn: str | Dsn) -> Backend:
    parsed = dsn if isinstance(dsn, Dsn) else parse_dsn(dsn)
    if parsed.dialect == "postgres":
        return PostgresBackend(parsed)
    return SqliteBackend(parsed)
