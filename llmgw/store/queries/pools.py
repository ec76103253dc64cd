"""The pooled limits' counters and concurrency slots: the store's queries for them, mixed into `Store` (the
pooled limiter, store/limits/, is their one caller)."""

from __future__ import annotations

from llmgw.store.db import Backend
from llmgw.store.errors import StoreError
from llmgw.store.records import ShareGrant


class PoolQueries:
    db: Backend

    # ------------------------------------------------------------------------------------ limit shares

    async def take_share(
        self, limit_key: str, window_start: float, window_end: float, want: int, limit: int, now: float
    ) -> ShareGrant:
        """Atomically take up to `want` units of `limit` in this window; one statement, so racing takers
        together never get more than `limit` (the UPDATE sees the row as the previous taker left it)."""
        if want < 0 or limit < 0:
            raise StoreError(f"take_share({limit_key!r}): want and limit must be >= 0, got {want}, {limit}")
        first = min(want, limit)
        t = "limit_counters.taken"
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "INSERT INTO limit_counters (limit_key, window_start, window_end, taken, granted, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (limit_key, window_start) DO UPDATE SET "
                f"taken = CASE WHEN {t} + ? <= ? THEN {t} + ? WHEN {t} >= ? THEN {t} ELSE ? END, "
                f"granted = CASE WHEN {t} + ? <= ? THEN ? WHEN {t} >= ? THEN 0 ELSE ? - {t} END, "
                "updated_at = excluded.updated_at RETURNING taken, granted",
                (
                    limit_key,
                    window_start,
                    window_end,
                    first,
                    first,
                    now,
                    want,
                    limit,
                    want,
                    limit,
                    limit,
                    want,
                    limit,
                    want,
                    limit,
                    limit,
                ),
            )
        return ShareGrant(granted=int(rows[0][1]), taken=int(rows[0][0]))

    async def seed_counter(
        self, limit_key: str, window_start: float, window_end: float, taken: int, now: float
    ) -> bool:
        """Create a window's row already `taken` units in (from usage), unless it exists. True if created."""
        async with self.db.tx() as tx:
            count = await tx.execute(
                "INSERT INTO limit_counters (limit_key, window_start, window_end, taken, granted, updated_at) "
                "VALUES (?, ?, ?, ?, 0, ?) ON CONFLICT (limit_key, window_start) DO NOTHING",
                (limit_key, window_start, window_end, taken, now),
            )
        return count > 0

    async def counter_taken(self, limit_key: str, window_start: float) -> int | None:
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT taken FROM limit_counters WHERE limit_key = ? AND window_start = ?",
                (limit_key, window_start),
            )
        return int(rows[0][0]) if rows else None

    async def prune_counters(self, before: float) -> int:
        """Drop windows that ended before `before`."""
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM limit_counters WHERE window_end < ?", (before,))

    # ------------------------------------------------------------------------------------ concurrency slots

    async def hold_slots(
        self,
        limit_key: str,
        holder: str,
        want: int,
        limit: int,
        now: float,
        expires_at: float,
        spare: int = 0,
    ) -> int:
        """Set `holder`'s hold on a concurrency limit to `want` slots, or to as many as the other live holds
        leave free (never below 0); renews the hold to `expires_at`. Returns the slots now held. A decrease
        always succeeds (unless others already hold more than their due). Serialised per limit by the
        pool row, so racing holders never hold more than `limit` between them. Fewer than `want` held marks
        the pool as wanted now (`slots_wanted_at`).

        `spare` more are held too when the pool stays at most half full with them: a holder whose load swings
        by a few does not ask again on the rise, and another holder still finds half the limit free."""
        if want < 0 or limit < 0 or spare < 0:
            raise StoreError(
                f"hold_slots({limit_key!r}): want, limit and spare must be >= 0, got {want}, {limit}, {spare}"
            )
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO concurrency_pools (limit_key, updated_at) VALUES (?, ?) "
                "ON CONFLICT (limit_key) DO UPDATE SET updated_at = excluded.updated_at",
                (limit_key, now),
            )
            rows = await tx.fetch(
                "INSERT INTO concurrency_holds (limit_key, holder, slots, expires_at) "
                "SELECT ?, ?, CASE WHEN 2 * (o.used + ?) <= ? THEN ? WHEN ? <= ? - o.used THEN ? "
                "WHEN ? - o.used > 0 THEN ? - o.used ELSE 0 END, ? "
                "FROM (SELECT CAST(COALESCE(SUM(slots), 0) AS BIGINT) AS used FROM concurrency_holds "
                "WHERE limit_key = ? AND holder <> ? AND expires_at > ?) o WHERE true "
                "ON CONFLICT (limit_key, holder) DO UPDATE SET slots = excluded.slots, "
                "expires_at = excluded.expires_at RETURNING slots",
                (
                    limit_key,
                    holder,
                    want + spare,
                    limit,
                    want + spare,
                    want,
                    limit,
                    want,
                    limit,
                    limit,
                    expires_at,
                    limit_key,
                    holder,
                    now,
                ),
            )
            held = int(rows[0][0])
            if held < want:  # told to the holders keeping idle slots of this limit (slots_wanted_at)
                await tx.execute(
                    "UPDATE concurrency_pools SET wanted_at = ? WHERE limit_key = ?", (now, limit_key)
                )
        return held

    async def slots_wanted_at(self, limit_key: str) -> float | None:
        """When a holder last asked `limit_key` for more slots than were free (its `now`); None: never."""
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT wanted_at FROM concurrency_pools WHERE limit_key = ?", (limit_key,))
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    async def renew_slots(self, holder: str, now: float, expires_at: float) -> int:
        """Extend every non-empty hold of `holder` to `expires_at` and drop lapsed and empty holds (anyone's);
        returns how many of `holder`'s holds were renewed (fewer than it thinks it has: some lapsed)."""
        async with self.db.tx() as tx:
            renewed = await tx.execute(
                "UPDATE concurrency_holds SET expires_at = ? WHERE holder = ? AND slots > 0 AND expires_at > ?",
                (expires_at, holder, now),
            )
            await tx.execute("DELETE FROM concurrency_holds WHERE expires_at <= ? OR slots = 0", (now,))
        return renewed

    async def drop_slots(self, holder: str) -> int:
        """Give back every slot `holder` holds (a router stopping cleanly); the number of holds dropped."""
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM concurrency_holds WHERE holder = ?", (holder,))

    async def slots_held(self, limit_key: str, now: float) -> int:
        """Slots of a concurrency limit held by live holds, all holders together."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT COALESCE(SUM(slots), 0) FROM concurrency_holds WHERE limit_key = ? AND expires_at > ?",
                (limit_key, now),
            )
        return int(rows[0][0])
