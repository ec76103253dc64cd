"""Versioned migrations: numbered SQL files applied in order, each once, recorded in `schema_version`.

Running them is idempotent, so every process calls `migrate` at start-up; a store written by a newer
llmgw (a version we do not know) is refused rather than half-understood.

Most are written once for both stores (`NNNN_name.sql`). What only one dialect has (SQLite's FTS5 virtual
tables and triggers, PostgreSQL's generated tsvector columns) comes as a pair under one number,
`NNNN_name.sqlite.sql` and `NNNN_name.postgres.sql`: each store applies its own, so both end at the same version.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from importlib import resources

from llmgw.store.db import Backend, Dialect
from llmgw.store.errors import StoreError

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)(?:\.(sqlite|postgres))?\.sql$")

# Created here rather than in a migration because it records the migrations themselves. BIGINT, not INTEGER:
# INTEGER is 64 bits in SQLite but 32 in PostgreSQL.
_SCHEMA_VERSION = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    BIGINT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
)
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    dialect: Dialect | None = None  # None: both stores run it


_DIALECT_OF_SUFFIX: dict[str | None, Dialect | None] = {
    None: None,
    "sqlite": "sqlite",
    "postgres": "postgres",
}
_BEGIN = re.compile(r"\bBEGIN\b", re.I)
_END = re.compile(r"\bEND\s*$", re.I)


def _body_open(statement: str) -> bool:
    return bool(_BEGIN.search(statement)) and not _END.search(statement)


def split_statements(sql: str) -> tuple[str, ...]:
    """Statements of a migration file; `--` comment lines dropped, split on `;` (none occur inside strings),
    except inside a trigger's `BEGIN ... END` body, whose own statements end with `;` too."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    out: list[str] = []
    pending = ""
    for piece in "\n".join(lines).split(";"):
        pending = f"{pending};{piece}" if pending else piece
        if _body_open(pending.strip()):
            continue  # a trigger body not closed yet: its `;` was one of its statements
        if pending.strip():
            out.append(pending.strip())
        pending = ""
    if pending.strip():
        raise StoreError(f"a trigger body is never closed with END: {pending.strip()[:80]!r}")
    return tuple(out)


def load_migrations() -> list[Migration]:
    found: list[Migration] = []
    for entry in resources.files("llmgw.store").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match is None:
            continue
        statements = split_statements(entry.read_text("utf-8"))
        dialect = _DIALECT_OF_SUFFIX[match.group(3)]
        found.append(Migration(int(match.group(1)), match.group(2), statements, dialect))
    found.sort(key=lambda m: (m.version, m.dialect or ""))
    check_pairs(found)
    return found


def check_pairs(migrations: list[Migration]) -> None:
    """Each store sees every number once, and a migration for one dialect has its twin for the other."""
    for dialect in ("sqlite", "postgres"):
        versions = [m.version for m in migrations if m.dialect in (None, dialect)]
        if len(set(versions)) != len(versions):
            raise StoreError(f"two migrations share a number on {dialect}: {versions}")
    for version in sorted({m.version for m in migrations if m.dialect}):
        dialects = sorted(str(m.dialect) for m in migrations if m.version == version)
        if dialects != ["postgres", "sqlite"]:
            raise StoreError(f"migration {version:04d} is written for {dialects} only: write both")


async def current_version(db: Backend) -> int:
    async with db.tx() as tx:
        await tx.execute(_SCHEMA_VERSION)
        rows = await tx.fetch("SELECT COALESCE(MAX(version), 0) FROM schema_version")
    return int(rows[0][0])


async def migrate(db: Backend, migrations: list[Migration] | None = None) -> list[int]:
    """Apply every migration not yet applied, each in its own transaction; returns the versions applied."""
    todo = [
        m
        for m in (load_migrations() if migrations is None else migrations)
        if m.dialect in (None, db.dialect)
    ]
    have = await current_version(db)
    known = max((m.version for m in todo), default=0)
    if have > known:
        raise StoreError(
            f"the store {db.dsn.redacted()} is at schema version {have}, newer than this llmgw knows "
            f"({known}); upgrade llmgw before using this store"
        )
    applied: list[int] = []
    for migration in todo:
        if migration.version <= have:
            continue
        async with db.tx() as tx:
            for statement in migration.statements:
                await tx.execute(statement)
            await tx.execute(
                "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?) "
                "ON CONFLICT (version) DO NOTHING",
                (migration.version, migration.name, time.time()),
            )
        applied.append(migration.version)
    return applied


_DOWN = re.compile(r"^(\d{4})_([a-z0-9_]+)\.down\.sql$")


def load_down_migrations() -> dict[int, Migration]:
    """The migrations that can be undone: `NNNN_name.down.sql` beside `NNNN_name.sql`, by version. Only these
    may be crossed by an upgrade that must be able to roll back (`llmgw upgrade --control-plane`)."""
    found: dict[int, Migration] = {}
    for entry in resources.files("llmgw.store").joinpath("migrations").iterdir():
        match = _DOWN.match(entry.name)
        if match is not None:
            version = int(match.group(1))
            found[version] = Migration(version, match.group(2), split_statements(entry.read_text("utf-8")))
    return found


async def migrate_down(db: Backend, to_version: int, downs: dict[int, Migration] | None = None) -> list[int]:
    """Undo every applied migration above `to_version`, newest first, each in its own transaction with its
    schema_version row; refuses before undoing anything when one of them has no down file. `downs`: the
    package's (load_down_migrations) unless given."""
    have = await current_version(db)
    async with db.tx() as tx:
        rows = await tx.fetch(
            "SELECT version FROM schema_version WHERE version > ? ORDER BY version DESC", (to_version,)
        )
    versions = [int(r[0]) for r in rows]
    downs = load_down_migrations() if downs is None else downs
    missing = [v for v in versions if v not in downs]
    if missing:
        raise StoreError(
            f"the store {db.dsn.redacted()} is at schema version {have}; migrations {missing} have no .down.sql, "
            f"so it cannot go back to {to_version}: restore a backup taken before them instead"
        )
    for version in versions:
        async with db.tx() as tx:
            for statement in downs[version].statements:
                await tx.execute(statement)
            await tx.execute("DELETE FROM schema_version WHERE version = ?", (version,))
    return versions
