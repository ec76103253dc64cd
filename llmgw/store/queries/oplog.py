"""The audit log and the notification outbox: the store's queries for them, mixed into `Store`.

The audit log has an insert and a select and nothing else: there is no update or delete path for it in the
store's API (a test checks), so an admin token cannot rewrite who did what through llmgw.
"""

from __future__ import annotations

from typing import Any

from llmgw.store.db import Backend, Row
from llmgw.store.records import AuditEntry, Delivery

_AUDIT_COLUMNS = "id, time, actor, actor_detail, action, object, outcome, reason, via"
_OUTBOX_COLUMNS = "id, notification, event, object, body, created_at, attempts, next_at, last_error, dead_at"


def _audit(r: Row) -> AuditEntry:
    return AuditEntry(
        time=float(r[1]),
        actor=r[2],
        actor_detail=r[3],
        action=r[4],
        object=r[5],
        outcome=r[6],
        reason=r[7],
        via=r[8],
        id=r[0],
    )


def _delivery(r: Row) -> Delivery:
    return Delivery(
        id=r[0],
        notification=r[1],
        event=r[2],
        object=r[3],
        body=r[4],
        created_at=float(r[5]),
        attempts=int(r[6]),
        next_at=float(r[7]),
        last_error=r[8],
        dead_at=float(r[9]) if r[9] is not None else None,
    )


class OpLogQueries:
    db: Backend

    # ------------------------------------------------------------------------------------ audit

    async def record_audit(self, entry: AuditEntry) -> None:
        """Append one entry; the same entry written twice (a retry) is kept once."""
        async with self.db.tx() as tx:
            await tx.execute(
                f"INSERT INTO audit_log ({_AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING",
                (
                    entry.id,
                    entry.time,
                    entry.actor,
                    entry.actor_detail,
                    entry.action,
                    entry.object,
                    entry.outcome,
                    entry.reason,
                    entry.via,
                ),
            )

    async def list_audit(
        self, since: float | None = None, actor: str | None = None, limit: int = 200
    ) -> list[AuditEntry]:
        """Entries newest first, from `since` on, of one actor when given."""
        where = "WHERE time >= ?"
        params: list[Any] = [since if since is not None else float("-inf")]
        if actor is not None:
            where, params = where + " AND actor = ?", [*params, actor]
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_AUDIT_COLUMNS} FROM audit_log {where} ORDER BY time DESC, id DESC LIMIT ?",
                (*params, limit),
            )
        return [_audit(r) for r in rows]

    # ------------------------------------------------------------------------------------ outbox

    async def enqueue_delivery(self, delivery: Delivery) -> None:
        async with self.db.tx() as tx:
            await tx.execute(
                f"INSERT INTO notification_outbox ({_OUTBOX_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING",
                (
                    delivery.id,
                    delivery.notification,
                    delivery.event,
                    delivery.object,
                    delivery.body,
                    delivery.created_at,
                    delivery.attempts,
                    delivery.next_at,
                    delivery.last_error,
                    delivery.dead_at,
                ),
            )

    async def due_deliveries(self, now: float, limit: int = 50) -> list[Delivery]:
        """Live (not dead) deliveries whose next attempt is due, oldest first."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_OUTBOX_COLUMNS} FROM notification_outbox WHERE dead_at IS NULL AND next_at <= ? "
                "ORDER BY next_at, id LIMIT ?",
                (now, limit),
            )
        return [_delivery(r) for r in rows]

    async def next_delivery_at(self) -> float | None:
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT MIN(next_at) FROM notification_outbox WHERE dead_at IS NULL")
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    async def list_deliveries(self, dead: bool | None = None, limit: int = 200) -> list[Delivery]:
        """Deliveries oldest first: waiting ones (dead False), dead letters (True), or both (None)."""
        where = {None: "", True: "WHERE dead_at IS NOT NULL", False: "WHERE dead_at IS NULL"}[dead]
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_OUTBOX_COLUMNS} FROM notification_outbox {where} ORDER BY created_at, id LIMIT ?",
                (limit,),
            )
        return [_delivery(r) for r in rows]

    async def delivery_counts(self) -> tuple[int, int]:
        """(waiting, dead) rows of the outbox."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT CAST(COALESCE(SUM(CASE WHEN dead_at IS NULL THEN 1 ELSE 0 END), 0) AS BIGINT), "
                "CAST(COALESCE(SUM(CASE WHEN dead_at IS NULL THEN 0 ELSE 1 END), 0) AS BIGINT) "
                "FROM notification_outbox"
            )
        return int(rows[0][0]), int(rows[0][1])

    async def delivery_retry(self, delivery_id: str, attempts: int, next_at: float, error: str) -> None:
        async with self.db.tx() as tx:
            await tx.execute(
                "UPDATE notification_outbox SET attempts = ?, next_at = ?, last_error = ? WHERE id = ?",
                (attempts, next_at, error, delivery_id),
            )

    async def delivery_dead(self, delivery_id: str, attempts: int, error: str, now: float) -> None:
        async with self.db.tx() as tx:
            await tx.execute(
                "UPDATE notification_outbox SET attempts = ?, last_error = ?, dead_at = ? WHERE id = ?",
                (attempts, error, now, delivery_id),
            )

    async def delivery_done(self, delivery_id: str) -> None:
        """Delivered: the row goes (the outbox holds only what is still owed, and dead letters)."""
        async with self.db.tx() as tx:
            await tx.execute("DELETE FROM notification_outbox WHERE id = ?", (delivery_id,))

    async def mark_once(self, mark: str, now: float) -> bool:
        """True the first time `mark` is set (this event is news), False every time after."""
        async with self.db.tx() as tx:
            count = await tx.execute(
                "INSERT INTO notification_marks (mark, time) VALUES (?, ?) ON CONFLICT (mark) DO NOTHING",
                (mark, now),
            )
        return count > 0

    async def prune_marks(self, before: float) -> int:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM notification_marks WHERE time < ?", (before,))
