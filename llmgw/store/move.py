"""`llmgw store move`: copy every table from one store to another, parents before children.

Keys are stored hashed, so a store that is recreated instead of copied cannot give them back: every user
would need a new key. One transaction per table rather than one for the whole copy, so a large usage table
does not have to fit in one transaction; a failed copy is therefore partial, which is why the destination
must start empty (start again by dropping and recreating it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmgw.store.errors import StoreError
from llmgw.store.store import TABLES, Store

# Column lists per table (a test checks them against the migrations). The first column orders the paging.
COLUMNS: dict[str, tuple[str, ...]] = {
    "revision_events": (
        "id",
        "revision",
        "source",
        "applied_at",
        "actor",
        "actor_detail",
        "status",
        "errors",
    ),
    "nodes": ("name", "first_seen", "last_seen", "state", "inventory"),
    "replicas": (
        "id",
        "model",
        "profile",
        "nodes",
        "state",
        "fingerprint",
        "created_at",
        "updated_at",
        "replaces",
        "restart_asked",
    ),
    "events": ("id", "time", "kind", "object", "message"),
    "api_keys": (
        "id",
        "prefix",
        "hash",
        "project",
        "name",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
        "owner",
    ),
    "usage": (
        "id",
        "time",
        "request_id",
        "project",
        "team",
        "org",
        "key_id",
        "model",
        "tokens_in",
        "tokens_out",
        "cost",
        "latency_ms",
        "status",
        "fallback_used",
        "router_id",
        "endpoint",
        "queue_ms",
        "ttft_ms",
        "attempts",
        "decision",
        "code",
        "stream",
        "prefix",
        "guard",
        "person",
    ),
    "usage_tags": ("usage_id", "key", "value"),
    "limit_counters": ("limit_key", "window_start", "window_end", "taken", "granted", "updated_at"),
    "leases": ("name", "holder", "expires_at", "epoch"),
    "concurrency_pools": ("limit_key", "updated_at", "wanted_at"),
    "concurrency_holds": ("limit_key", "holder", "slots", "expires_at"),
    "audit_log": ("id", "time", "actor", "actor_detail", "action", "object", "outcome", "reason", "via"),
    "notification_outbox": (
        "id",
        "notification",
        "event",
        "object",
        "body",
        "created_at",
        "attempts",
        "next_at",
        "last_error",
        "dead_at",
    ),
    "notification_marks": ("mark", "time"),
    "capacity": (
        "model",
        "profile",
        "gpu_class",
        "engine",
        "measured_at",
        "objective_ms",
        "concurrency",
        "tokens_per_s",
        "prefill_ms_per_token",
        "decode_ms_per_token",
        "load_s",
        "replica",
        "curve",
    ),
    "node_drains": ("node", "words", "at"),
    "facility_holds": ("domain", "words", "drain", "at"),
    "usage_minutes": (
        "minute",
        "model",
        "project",
        "source",
        "requests",
        "errors",
        "tokens_in",
        "tokens_out",
        "cost",
        "peak_concurrency",
    ),
    "content": ("kind", "project", "id", "created_at", "expires_at", "key_id", "sealed"),
    "model_checks": ("model", "engine", "engine_version", "verdict", "at"),
    "canary_runs": ("model", "run", "stable", "updated_at"),
    "commit_status_outbox": ("id", "seq", "sha", "state", "context", "description", "target_url"),
    "console_passwords": ("person", "hash", "set_at"),
    "chat_threads": ("id", "person", "title", "model", "created_at", "updated_at"),
    "chat_messages": ("thread_id", "seq", "role", "content", "created_at"),
    # Not `search` (PostgreSQL's generated tsvector) nor SQLite's FTS5 rows: each store derives its own index.
    "notes": ("id", "person", "title", "body", "created_at", "updated_at"),
    "fleet_suggestions": ("revision", "posted_at", "posted_by", "document"),
}
_ORDER = {
    "limit_counters": "limit_key, window_start",
    "concurrency_holds": "limit_key, holder",
    "capacity": "model, profile, gpu_class",
    "usage_tags": "usage_id, key",
    "usage_minutes": "minute, model, project, source",
    "content": "kind, project, id",
    "model_checks": "model, engine, engine_version",
    "chat_messages": "thread_id, seq",
}
PAGE = 1000


@dataclass(frozen=True)
class MoveReport:
    copied: dict[str, int]


async def move_store(
    src: Store, dst: Store, progress: Callable[[str, int], None] | None = None, *, replace: bool = False
) -> MoveReport:
    """Copy src into dst (both already migrated), then check that every table holds as many rows in both.
    Refuses a destination holding any row, unless `replace`: then its rows are deleted first."""
    if src.dsn == dst.dsn:
        raise StoreError(f"source and destination are the same store ({src.dsn.redacted()})")
    src_version, dst_version = await src.schema_version(), await dst.schema_version()
    if src_version != dst_version:
        raise StoreError(f"schema versions differ: source {src_version}, destination {dst_version}")
    nonempty = {t: n for t, n in (await dst.row_counts()).items() if n}
    if nonempty and replace:
        await _empty(dst)
    elif nonempty:
        listed = ", ".join(f"{t} ({n} rows)" for t, n in nonempty.items())
        raise StoreError(
            f"the destination {dst.dsn.redacted()} is not empty: {listed}. "
            "store move copies into an empty store only; give --replace to delete its rows first, or pick another"
        )
    copied: dict[str, int] = {}
    for table in TABLES:
        cols = ", ".join(COLUMNS[table])
        order = _ORDER.get(table, COLUMNS[table][0])
        marks = ", ".join("?" for _ in COLUMNS[table])
        count = 0
        async with dst.db.tx() as out:
            while True:
                async with src.db.tx() as inp:
                    rows = await inp.fetch(
                        f"SELECT {cols} FROM {table} ORDER BY {order} LIMIT ? OFFSET ?", (PAGE, count)
                    )
                if not rows:
                    break
                await out.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)
                count += len(rows)
        copied[table] = count
        if progress is not None:
            progress(table, count)
    await _check_counts(src, dst)
    return MoveReport(copied)


async def _empty(store: Store) -> None:
    """Delete every row of every table, children before parents, in one transaction."""
    async with store.db.tx() as tx:
        for table in reversed(TABLES):
            await tx.execute(f"DELETE FROM {table}")


async def _check_counts(src: Store, dst: Store) -> None:
    """Both stores hold as many rows per table: a writer that kept going, or a row lost, is said."""
    before, after = await src.row_counts(), await dst.row_counts()
    differ = {t: (before[t], after.get(t)) for t in before if before[t] != after.get(t)}
    if differ:
        listed = ", ".join(f"{t} (source {a}, destination {b})" for t, (a, b) in differ.items())
        raise StoreError(
            f"after the copy the row counts differ: {listed}. Was a writer still running on the source? "
            "Stop the controller and routers, then move again with --replace"
        )
