"""The store: every query llmgw runs, written once for SQLite and PostgreSQL, behind typed methods.

Nothing outside this package writes SQL. Times are passed in by the caller (a clock at the edge), so tests
choose them and two processes agree on what "expired" means only through the values they pass.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from itertools import chain
from typing import Any

from llmgw.store.db import Backend, Dsn, Row, Tx, open_backend, row_chunks
from llmgw.store.errors import LeaseFenced, StoreError
from llmgw.store.migrate import current_version, migrate
from llmgw.store.queries.capacity import CapacityQueries
from llmgw.store.queries.content import ContentQueries
from llmgw.store.queries.holds import HoldQueries
from llmgw.store.queries.intent import IntentQueries
from llmgw.store.queries.notes import NotesQueries
from llmgw.store.queries.oplog import OpLogQueries
from llmgw.store.queries.passwords import PasswordQueries
from llmgw.store.queries.pools import PoolQueries
from llmgw.store.queries.request_queries import (
    USAGE_COLUMNS as _USAGE_COLUMNS,
    RequestQueries,
    json_column,
    usage_record,
)
from llmgw.store.queries.suggestions import SuggestionQueries
from llmgw.store.queries.threads import ThreadQueries
from llmgw.store.queries.traffic import TrafficQueries
from llmgw.store.records import (
    USAGE_GROUPS,
    ApiKey,
    Event,
    Fence,
    KeyLookup,
    LeaseResult,
    LeaseRow,
    NodeRow,
    ReplicaRecord,
    Revision,
    UsageGroup,
    UsageRecord,
    UsageTotal,
)

# Every table, parents before children (usage references api_keys). `store move` copies in this order and
# a test derives the foreign keys from the schema to check it.
TABLES: tuple[str, ...] = (
    "revision_events",
    "nodes",
    "replicas",
    "events",
    "api_keys",
    "usage",
    "usage_tags",
    "limit_counters",
    "leases",
    "concurrency_pools",
    "concurrency_holds",
    "audit_log",
    "notification_outbox",
    "notification_marks",
    "capacity",
    "node_drains",
    "facility_holds",
    "usage_minutes",
    "content",
    "model_checks",
    "canary_runs",
    "commit_status_outbox",
    "console_passwords",
    "chat_threads",
    "chat_messages",
    "notes",
    "fleet_suggestions",
)

# Grouping columns come from this fixed table, never from the caller's text, so an unknown one is an error
# and not a fragment of SQL.
# Grouped by key, the key's name and project come along from api_keys by a LEFT JOIN, so usage of a key
# no longer in api_keys (or of no key) still counts, with NULL name and project.
_GROUP_COLUMNS: dict[UsageGroup, tuple[str, ...]] = {
    "project": ("u.project",),
    "team": ("u.team",),
    "org": ("u.org",),
    "key": ("COALESCE(u.key_id, '')", "k.name", "k.project"),
    "model": ("u.model",),
    "router": ("u.router_id",),
    "person": ("COALESCE(u.person, '')",),
}
_GROUP_FROM: dict[UsageGroup, str] = {"key": "usage u LEFT JOIN api_keys k ON k.id = u.key_id"}
_LEVEL_COLUMN = {"project": "project", "team": "team", "org": "org", "organization": "org"}

_KEY_COLUMNS = "id, prefix, project, name, created_at, expires_at, revoked_at, last_used_at, owner"

# How long a transaction holding the lease's row lock may wait on its silent client before the server ends it.
# A leader cut from PostgreSQL between its lease statement and the COMMIT otherwise held the row locked until
# the server's TCP gave up, hours, and the standby's takeover waited on it (the likely cause of a CI run's
# partition test in which the standby never led).
# Far above a healthy controller's pause between two statements of one transaction (milliseconds), and under
# the lease's TTL (`lease_lock_silence_s`), so the lock is free before the claim has run out.
LEASE_LOCK_SILENCE_S = 10.0


def lease_lock_silence_s(ttl: float | None) -> float:
    """How long a lease transaction's client may be silent before the server ends it: 10 s, or two thirds of
    a shorter TTL. A fixed 10 s under an operator's `lease_ttl` of 6 s kept a cut leader's lock 4 s past its
    claim, and the standby's takeover waited on it."""
    return LEASE_LOCK_SILENCE_S if ttl is None else min(LEASE_LOCK_SILENCE_S, ttl * 2 / 3)


# 25 columns x 32 rows stays under SQLite's oldest bound-parameter limit (999); tags: 3 x 256.
_USAGE_ROWS_PER_INSERT = 32
_USAGE_ROW_PLACEHOLDERS = "(" + ", ".join(["?"] * 25) + ")"
_TAG_ROWS_PER_INSERT = 256


def _key(row: Row) -> ApiKey:
    # A personal key without a default project is stored with project '' (the column is NOT NULL).
    return ApiKey(row[0], row[1], row[2] or None, row[3], row[4], row[5], row[6], row[7], row[8])


def _spend_filter(level: str, name: str) -> tuple[str, tuple[str, ...]]:
    """The usage rows a level's budget counts: its column's, a person's, or a person's within one scope."""
    if level == "person":
        return "person = ?", (name,)
    if level == "member":  # PERSON@KIND/SCOPE (llmgw.core.tenancy.people.member_level)
        person, _, scope = name.partition("@")
        kind, _, scope_name = scope.partition("/")
        column = _LEVEL_COLUMN.get(kind)
        if column is None or not person or not scope_name:
            raise StoreError(
                f"member level {name!r}: expected PERSON@KIND/SCOPE, KIND project, team or organization"
            )
        return f"person = ? AND {column} = ?", (person, scope_name)
    column = _LEVEL_COLUMN.get(level)
    if column is None:
        raise StoreError(f"unknown tenant level {level!r}: expected project, team, org, person or member")
    return f"{column} = ?", (name,)


def _last_use_updates(records: Sequence[UsageRecord]) -> list[tuple[str, list[Any]]]:
    """One UPDATE per key in the batch, raising its last use to the batch's newest request and never
    lowering it (a spooled batch written late carries older times)."""
    newest: dict[str, float] = {}
    for r in records:
        if r.key_id is not None and r.time > newest.get(r.key_id, float("-inf")):
            newest[r.key_id] = r.time
    sql = "UPDATE api_keys SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)"
    return [(sql, [t, key_id, t]) for key_id, t in sorted(newest.items())]


class Store(
    OpLogQueries,
    CapacityQueries,
    RequestQueries,
    TrafficQueries,
    ContentQueries,
    IntentQueries,
    PoolQueries,
    ThreadQueries,
    NotesQueries,
    PasswordQueries,
    HoldQueries,
    SuggestionQueries,
):
    """Typed access to the llmgw database. Open with `await Store.open(dsn)`; close with `await close()`."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    @classmethod
    async def open(cls, dsn: str | Dsn, *, migrate_schema: bool = True) -> Store:
        store = cls(open_backend(dsn))
        if migrate_schema:
            try:
                await store.migrate()
            except BaseException:
                await store.close()
                raise
        return store

    @property
    def dsn(self) -> Dsn:
        return self.db.dsn

    async def migrate(self) -> list[int]:
        return await migrate(self.db)

    async def schema_version(self) -> int:
        return await current_version(self.db)

    async def close(self) -> None:
        await self.db.close()

    async def row_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        async with self.db.tx() as tx:
            for table in TABLES:
                counts[table] = int((await tx.fetch(f"SELECT COUNT(*) FROM {table}"))[0][0])
        return counts

    # ------------------------------------------------------------------------------------ revisions

    async def record_revision(self, revision: Revision) -> None:
        """Append one history row; the same record written twice (a retry) is kept once."""
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO revision_events (id, revision, source, applied_at, actor, actor_detail, status, "
                "errors) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (
                    revision.id,
                    revision.sha,
                    revision.source,
                    revision.applied_at,
                    revision.applied_by,
                    revision.actor_detail,
                    revision.status,
                    json.dumps(list(revision.errors)),
                ),
            )

    async def list_revisions(self, limit: int = 50, status: str | None = None) -> list[Revision]:
        """History rows, newest first (every application, so a label may appear more than once)."""
        where, params = ("WHERE status = ?", [status]) if status else ("", [])
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT revision, source, applied_at, actor, status, errors, actor_detail, id "
                f"FROM revision_events {where} ORDER BY applied_at DESC, id LIMIT ?",
                (*params, limit),
            )
        return [Revision(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5])), r[6], r[7]) for r in rows]

    async def last_accepted_revision(self) -> Revision | None:
        found = await self.list_revisions(limit=1, status="accepted")
        return found[0] if found else None

    # ------------------------------------------------------------------------------------ nodes

    async def upsert_node(self, name: str, state: str, inventory: dict[str, Any], now: float) -> None:
        """Record a node seen now; `first_seen` is kept from the first time."""
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO nodes (name, first_seen, last_seen, state, inventory) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen, state = excluded.state, "
                "inventory = excluded.inventory",
                (name, now, now, state, json.dumps(inventory, sort_keys=True)),
            )

    async def set_node_state(self, name: str, state: str) -> bool:
        async with self.db.tx() as tx:
            return await tx.execute("UPDATE nodes SET state = ? WHERE name = ?", (state, name)) > 0

    async def list_nodes(self) -> list[NodeRow]:
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT name, first_seen, last_seen, state, inventory FROM nodes ORDER BY name"
            )
        return [NodeRow(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    async def delete_node(self, name: str) -> bool:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM nodes WHERE name = ?", (name,)) > 0

    async def save_model_check(self, model: str, engine: str, version: str, verdict: str, now: float) -> None:
        """Keep the last `llmgw model check` verdict (its JSON) for the model on that engine version."""
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO model_checks (model, engine, engine_version, verdict, at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (model, engine, engine_version) DO UPDATE SET verdict = excluded.verdict, "
                "at = excluded.at",
                (model, engine, version, verdict, now),
            )

    async def list_model_checks(self) -> list[str]:
        """Every kept verdict's JSON."""
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT verdict FROM model_checks ORDER BY model, engine, engine_version")
        return [str(r[0]) for r in rows]

    # ------------------------------------------------------------------------------------ replicas

    async def upsert_replica(self, replica: ReplicaRecord, fence: Fence | None = None) -> None:
        """Write `replica`; with `fence`, only while that lease still has that holder and epoch (`LeaseFenced`
        otherwise), checked in the same transaction."""
        async with self.db.tx() as tx:
            await _check_fence(tx, fence)
            await tx.execute(
                "INSERT INTO replicas (id, model, profile, nodes, state, fingerprint, created_at, updated_at, "
                "replaces, restart_asked) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "model = excluded.model, profile = excluded.profile, nodes = excluded.nodes, "
                "state = excluded.state, fingerprint = excluded.fingerprint, updated_at = excluded.updated_at, "
                "replaces = excluded.replaces, restart_asked = excluded.restart_asked",
                (
                    replica.id,
                    replica.model,
                    replica.profile,
                    json.dumps(list(replica.nodes)),
                    replica.state,
                    replica.fingerprint,
                    replica.created_at,
                    replica.updated_at,
                    replica.replaces,
                    int(replica.restart_asked),
                ),
            )

    async def list_replicas(self, model: str | None = None) -> list[ReplicaRecord]:
        where, params = ("WHERE model = ?", (model,)) if model else ("", ())
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT id, model, profile, nodes, state, fingerprint, created_at, updated_at, replaces, "
                "restart_asked FROM replicas "
                f"{where} ORDER BY model, id",
                params,
            )
        return [
            ReplicaRecord(r[0], r[1], r[2], tuple(json.loads(r[3])), r[4], r[5], r[6], r[7], r[8], bool(r[9]))
            for r in rows
        ]

    async def delete_replica(self, replica_id: str, fence: Fence | None = None) -> bool:
        async with self.db.tx() as tx:
            await _check_fence(tx, fence)
            return await tx.execute("DELETE FROM replicas WHERE id = ?", (replica_id,)) > 0

    # ------------------------------------------------------------------------------------ events

    async def add_event(self, kind: str, obj: str, message: str, now: float) -> Event:
        event = Event(uuid.uuid4().hex, now, kind, obj, message)
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO events (id, time, kind, object, message) VALUES (?, ?, ?, ?, ?)",
                (event.id, event.time, event.kind, event.object, event.message),
            )
        return event

    async def recent_events(self, limit: int = 100, since: float | None = None) -> list[Event]:
        """Newest first."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT id, time, kind, object, message FROM events WHERE time >= ? "
                "ORDER BY time DESC, id LIMIT ?",
                (since if since is not None else float("-inf"), limit),
            )
        return [Event(*r) for r in rows]

    async def prune_events(self, before: float) -> int:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM events WHERE time < ?", (before,))

    # ------------------------------------------------------------------------------------ api keys

    async def insert_key(self, key: ApiKey, key_hash: str) -> None:
        async with self.db.tx() as tx:
            await tx.execute(
                f"INSERT INTO api_keys ({_KEY_COLUMNS}, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.id,
                    key.prefix,
                    key.project or "",
                    key.name,
                    key.created_at,
                    key.expires_at,
                    key.revoked_at,
                    key.last_used_at,
                    key.owner,
                    key_hash,
                ),
            )

    async def get_key(self, key_id: str) -> ApiKey | None:
        async with self.db.tx() as tx:
            rows = await tx.fetch(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
        return _key(rows[0]) if rows else None

    async def list_keys(self, project: str | None = None, owner: str | None = None) -> list[ApiKey]:
        """Every key, or those of one project (its default project) and/or of one owner."""
        clauses = [c for c, v in (("project = ?", project), ("owner = ?", owner)) if v]
        where = "WHERE " + " AND ".join(clauses) if clauses else ""
        params = tuple(v for v in (project, owner) if v)
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_KEY_COLUMNS} FROM api_keys {where} ORDER BY created_at, id", params
            )
        return [_key(r) for r in rows]

    async def revoke_key(self, key_id: str, now: float) -> bool:
        """Revoke; false when there is no such key. Revoking twice keeps the first time."""
        async with self.db.tx() as tx:
            await tx.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (now, key_id)
            )
            rows = await tx.fetch("SELECT 1 FROM api_keys WHERE id = ?", (key_id,))
        return bool(rows)

    async def lookup_key(self, key_hash: str, now: float) -> KeyLookup | None:
        """The key with this hash and its state at `now`; None when no key has it (the router's 401 unknown)."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE hash = ?", (key_hash,))
        if not rows:
            return None
        key = _key(rows[0])
        return KeyLookup(key.id, key.project, key.state(now), key.expires_at, key.owner)

    # ------------------------------------------------------------------------------------ usage

    async def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        """Write a batch in one transaction. Idempotent: a record already written (same id) is skipped."""
        if not records:
            return
        rows = [
            (
                r.id,
                r.time,
                r.request_id,
                r.project,
                r.team,
                r.org,
                r.key_id,
                r.model,
                r.tokens_in,
                r.tokens_out,
                r.cost,
                r.latency_ms,
                r.status,
                int(r.fallback_used),
                r.router_id,
                r.endpoint,
                r.queue_ms,
                r.ttft_ms,
                json_column(r.attempts) if r.attempts else "",
                json_column(r.decision) if r.decision else "",
                r.code,
                int(r.stream) if r.stream is not None else None,
                r.prefix,
                json_column(r.guard) if r.guard else "",
                r.person,
            )
            for r in records
        ]
        tags = [(r.id, k, v) for r in records if r.tags for k, v in r.tags.items()]
        # Many rows per statement: SQLite's executemany steps (and drops and retakes the GIL) once per row,
        # which contends with the router's event loop; one statement per chunk does it once per chunk.
        statements = []
        for chunk in row_chunks(rows, _USAGE_ROWS_PER_INSERT):
            sql = (
                f"INSERT INTO usage ({_USAGE_COLUMNS}) VALUES "
                + ", ".join([_USAGE_ROW_PLACEHOLDERS] * len(chunk))
                + " ON CONFLICT (id) DO NOTHING"
            )
            statements.append((sql, list(chain.from_iterable(chunk))))  # the rows' values in order, in C
        for part in row_chunks(tags, _TAG_ROWS_PER_INSERT):  # after their usage rows: the foreign key
            sql = (
                "INSERT INTO usage_tags (usage_id, key, value) VALUES "
                + ", ".join(["(?, ?, ?)"] * len(part))
                + " ON CONFLICT (usage_id, key) DO NOTHING"
            )
            statements.append((sql, list(chain.from_iterable(part))))
        statements.extend(_last_use_updates(records))
        await self.db.run_in_tx(statements)

    async def list_usage(self, since: float | None = None, limit: int = 1000) -> list[UsageRecord]:
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_USAGE_COLUMNS} FROM usage WHERE time >= ? ORDER BY time, id LIMIT ?",
                (since if since is not None else float("-inf"), limit),
            )
        return [usage_record(r) for r in rows]

    async def usage_totals(
        self, by: UsageGroup, since: float | None = None, until: float | None = None
    ) -> list[UsageTotal]:
        """Totals grouped by one column (by key: also the key's name and project, see UsageTotal).
        Grouped by ordinal so both databases see the same expression."""
        if by not in USAGE_GROUPS:
            raise StoreError(f"cannot group usage by {by!r}: expected one of {', '.join(USAGE_GROUPS)}")
        columns = _GROUP_COLUMNS[by]
        n = len(columns)
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {', '.join(columns)}, COUNT(*), CAST(COALESCE(SUM(u.tokens_in), 0) AS BIGINT), "
                "CAST(COALESCE(SUM(u.tokens_out), 0) AS BIGINT), "
                "CAST(COALESCE(SUM(u.cost), 0) AS DOUBLE PRECISION), "
                "CAST(COALESCE(AVG(u.latency_ms), 0) AS DOUBLE PRECISION), "
                "CAST(COALESCE(SUM(CASE WHEN u.status >= 400 THEN 1 ELSE 0 END), 0) AS BIGINT) "
                f"FROM {_GROUP_FROM.get(by, 'usage u')} WHERE u.time >= ? AND u.time < ? "
                f"GROUP BY {', '.join(str(i) for i in range(1, n + 1))} ORDER BY 1",
                (
                    since if since is not None else float("-inf"),
                    until if until is not None else float("inf"),
                ),
            )
        totals = []
        for r in rows:
            name, project = (r[1], r[2]) if by == "key" else (None, None)
            requests, tokens_in, tokens_out, cost, latency, errors = r[n:]
            totals.append(
                UsageTotal(
                    str(r[0]),
                    int(requests),
                    int(tokens_in),
                    int(tokens_out),
                    float(cost),
                    float(latency),
                    int(errors),
                    key_name=name,
                    key_project=project,
                )
            )
        return totals

    async def spend(self, level: str, name: str, since: float, until: float | None = None) -> float:
        """Money spent in [since, until) by one tenant (project, team or org), one person (`person`, by name),
        or one person in one scope (`member`, `PERSON@KIND/SCOPE`): the budget's source of truth."""
        where, values = _spend_filter(level, name)
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT CAST(COALESCE(SUM(cost), 0) AS DOUBLE PRECISION) FROM usage "
                f"WHERE {where} AND time >= ? AND time < ?",
                (*values, since, until if until is not None else float("inf")),
            )
        return float(rows[0][0])

    # ------------------------------------------------------------------------------------ leases

    async def acquire_lease(self, name: str, holder: str, ttl: float, now: float) -> LeaseResult:
        """Take or renew `name` for `holder` until now+ttl, in one statement: it succeeds when the lease is
        free, expired, or already this holder's. Otherwise the current holder is returned, unchanged. The epoch
        is raised by one when the lease changes hands, kept on a renewal (writes are fenced by it)."""
        async with self.db.tx() as tx:
            await tx.end_if_client_silent(lease_lock_silence_s(ttl))
            rows = await tx.fetch(
                "INSERT INTO leases (name, holder, expires_at, epoch) VALUES (?, ?, ?, 1) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at, "
                "epoch = CASE WHEN leases.holder = excluded.holder THEN leases.epoch ELSE leases.epoch + 1 END "
                "WHERE leases.expires_at <= ? OR leases.holder = excluded.holder "
                "RETURNING holder, expires_at, epoch",
                (name, holder, now + ttl, now),
            )
            if rows:
                return LeaseResult(True, LeaseRow(name, str(rows[0][0]), float(rows[0][1]), int(rows[0][2])))
            current = await tx.fetch("SELECT holder, expires_at, epoch FROM leases WHERE name = ?", (name,))
        lease = (
            LeaseRow(name, str(current[0][0]), float(current[0][1]), int(current[0][2])) if current else None
        )
        return LeaseResult(False, lease)

    async def release_lease(self, name: str, holder: str, ttl: float | None = None) -> bool:
        """Give `name` up if `holder` has it; `ttl`: the lease's, which bounds a silent client's lock."""
        async with self.db.tx() as tx:
            await tx.end_if_client_silent(lease_lock_silence_s(ttl))
            return await tx.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder)) > 0

    async def get_lease(self, name: str) -> LeaseRow | None:
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT holder, expires_at, epoch FROM leases WHERE name = ?", (name,))
        return LeaseRow(name, str(rows[0][0]), float(rows[0][1]), int(rows[0][2])) if rows else None


async def _check_fence(tx: Tx, fence: Fence | None) -> None:
    """Refuse (LeaseFenced) when `fence` names a holder or epoch the lease no longer has. The check is a no-op
    update, so on PostgreSQL it locks the lease's row until the transaction ends: a takeover cannot slip between
    the check and the write (SQLite's transactions take the write lock up front)."""
    if fence is None:
        return
    await tx.end_if_client_silent(lease_lock_silence_s(fence.ttl_s))
    held = await tx.execute(
        "UPDATE leases SET epoch = epoch WHERE name = ? AND holder = ? AND epoch = ?",
        (fence.name, fence.holder, fence.epoch),
    )
    if held:
        return
    rows = await tx.fetch("SELECT holder, epoch FROM leases WHERE name = ?", (fence.name,))
    now = f"held by {rows[0][0]} at epoch {rows[0][1]}" if rows else "held by nobody"
    raise LeaseFenced(
        f"lease {fence.name} is {now}, not by {fence.holder} at epoch {fence.epoch}: "
        "a deposed leader's write is refused"
    )
