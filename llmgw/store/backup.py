"""A store's rows to one file and back: `llmgw store backup` / `llmgw store restore` (the store part).

SQLite through its online backup API (a consistent copy while the controller and routers keep writing; a copy
of the file could catch a page half-written, and would miss what is still in the WAL); PostgreSQL through
`pg_dump --format=custom` of the configured DSN and `pg_restore`, the tools that know every object the
migrations made. The secrets that must travel with the store are sealed elsewhere (llmgw.adapters.sealed_files).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from llmgw.store.db import Dsn, open_backend
from llmgw.store.errors import StoreError
from llmgw.store.store import TABLES

# Where Debian puts the server's own tools when /usr/bin has only the wrappers of another major version.
_PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"


def pg_tool(name: str) -> str:
    """The path of `pg_dump` or `pg_restore`: the newest major version installed (it must be at least the
    server's), else the one on PATH."""
    installed = sorted(Path("/").glob(_PG_BIN_GLOB.lstrip("/")), key=_major, reverse=True)
    for bindir in installed:
        if (bindir / name).exists():
            return str(bindir / name)
    found = shutil.which(name)
    if found is None:
        raise StoreError(
            f"{name} is not installed: a PostgreSQL store is backed up and restored with PostgreSQL's own "
            "tools (Debian: apt-get install postgresql-client)"
        )
    return found


def _major(bindir: Path) -> int:
    version = bindir.parent.name
    return int(version) if version.isdigit() else 0


@dataclass(frozen=True)
class Dumped:
    """What a dump holds, counted in the same snapshot the dump was taken from (writers keep going)."""

    schema_version: int
    rows: dict[str, int]


def dump_store(dsn: Dsn, out: Path) -> Dumped:
    """Write the store `dsn` to `out`: a SQLite database file, or a pg_dump custom-format archive."""
    if dsn.dialect == "sqlite":
        _sqlite_copy(Path(dsn.target), out)
        try:
            with contextlib.closing(sqlite3.connect(f"file:{out}?mode=ro", uri=True)) as copy:
                return _count(lambda sql: copy.execute(sql).fetchone())
        except sqlite3.Error as exc:
            raise StoreError(f"counting the rows of the SQLite backup {out}: {exc}") from exc
    # pg_dump reads the snapshot this transaction exported, so the counts are of exactly what it dumps.
    try:
        with psycopg.connect(dsn.target, connect_timeout=10) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            snapshot = _one(conn.execute("SELECT pg_export_snapshot()").fetchone())
            dumped = _count(lambda sql: conn.execute(sql).fetchone())
            argv = [
                pg_tool("pg_dump"),
                "--format=custom",
                "--no-owner",
                "--no-privileges",
                "--file",
                str(out),
            ]
            _run([*argv, f"--snapshot={snapshot}"], dsn)
            conn.rollback()
    except psycopg.Error as exc:
        raise StoreError(f"PostgreSQL store {dsn.redacted()}: {exc}") from exc
    return dumped


def _one(row: tuple[Any, ...] | None) -> Any:
    if row is None:
        raise StoreError("the store answered no row to a count")
    return row[0]


def _count(fetch_one: Callable[[str], tuple[Any, ...] | None]) -> Dumped:
    version = _one(fetch_one("SELECT COALESCE(MAX(version), 0) FROM schema_version"))
    rows = {table: int(_one(fetch_one(f"SELECT COUNT(*) FROM {table}"))) for table in TABLES}
    return Dumped(int(version), rows)


def load_store(dsn: Dsn, dump: Path, *, replace: bool) -> None:
    """Put the rows of `dump` (as dump_store wrote them) into the store `dsn`. The caller has checked that the
    target is empty, or was told to replace it (`replace`: what the dump holds is dropped first)."""
    if dsn.dialect == "sqlite":
        target = Path(dsn.target)
        if replace:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{target}{suffix}").unlink(missing_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        _sqlite_copy(dump, target)
        return
    # One transaction: a restore that fails leaves the database as it was, never half-loaded.
    clean = ["--clean", "--if-exists"] if replace else []
    flags = ["--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction", *clean]
    _run([pg_tool("pg_restore"), *flags, str(dump)], dsn)


def _sqlite_copy(source: Path, target: Path) -> None:
    if not source.exists():
        raise StoreError(f"no SQLite store at {source}")
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=10.0)
        try:
            dst = sqlite3.connect(str(target))
            try:
                src.backup(dst)  # page by page, restarting if a writer changes a page already copied
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as exc:
        raise StoreError(f"SQLite backup from {source} to {target}: {exc}") from exc


def _run(argv: list[str], dsn: Dsn) -> None:
    """Run a PostgreSQL tool against `dsn` (given as --dbname, so a URL and a conninfo both work; libpq's own
    PGPASSWORD / ~/.pgpass still apply)."""
    try:
        done = subprocess.run(
            [*argv, "--dbname", dsn.target], capture_output=True, text=True, check=False, timeout=3600
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StoreError(f"{Path(argv[0]).name} on {dsn.redacted()}: {exc}") from exc
    if done.returncode != 0:
        words = done.stderr.strip().replace(dsn.target, dsn.redacted())
        raise StoreError(f"{Path(argv[0]).name} on {dsn.redacted()} failed: {words[-2000:]}")


async def store_has_tables(dsn: Dsn) -> bool:
    """Whether the database `dsn` names holds any table (llmgw's or not): a restore goes into an empty one.
    A SQLite file that does not exist holds none, and is not made here."""
    if dsn.dialect == "sqlite":
        if not await asyncio.to_thread(Path(dsn.target).exists):
            return False
        sql = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'"
    else:
        sql = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()"
    backend = open_backend(dsn)
    try:
        async with backend.tx() as tx:
            return int((await tx.fetch(sql))[0][0]) > 0
    finally:
        await backend.close()
