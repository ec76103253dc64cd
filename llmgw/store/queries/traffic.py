"""Recorded traffic in the store: pages of usage rows for a trace, the bounded pruning of per-request rows
into per-minute aggregates, and the aggregates themselves (issue 21). Mixed into `Store`.

Pruning works in whole minutes (by completion), oldest first, at most about `batch` rows a call: a minute's
rows are folded into `usage_minutes` and deleted in one transaction, so a row is either still in `usage` or
counted in its minute, never both and never neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.core.traffic.recorded import (
    IMPORT_PREFIX,
    Finished,
    MinuteTotal,
    aggregate_minutes,
    merge_minutes,
    minute_of,
)
from llmgw.store.db import Backend, Row, Tx
from llmgw.store.queries.request_queries import USAGE_COLUMNS, usage_record
from llmgw.store.records import UsageRecord

__all__ = ["LOOKAHEAD_S", "PruneResult", "TrafficQueries"]

# Requests in flight during a pruned minute that completed up to this long after it still count towards its
# peak concurrency; a request longer than this counts only in the minutes it is pruned with.
LOOKAHEAD_S = 600.0
_CHUNK = 400  # ids per IN (...): under SQLite's oldest bound-parameter limit
_FINISHED = "id, time, latency_ms, model, project, router_id, status, tokens_in, tokens_out, cost"
_MINUTE_COLUMNS = (
    "minute, model, project, source, requests, errors, tokens_in, tokens_out, cost, peak_concurrency"
)


@dataclass(frozen=True)
class PruneResult:
    rows: int  # per-request rows folded into aggregates and deleted
    minutes: int  # aggregate rows written or updated


def _finished(r: Row) -> Finished:
    source = r[5] if str(r[5]).startswith(IMPORT_PREFIX) else ""
    return Finished(
        float(r[1]), float(r[2]) / 1000.0, r[3], r[4], source, int(r[6]), int(r[7]), int(r[8]), float(r[9])
    )


def _minute(r: Row) -> MinuteTotal:
    peak = int(r[9]) if r[9] is not None else None
    return MinuteTotal(
        float(r[0]), r[1], r[2], r[3], int(r[4]), int(r[5]), int(r[6]), int(r[7]), float(r[8]), peak
    )


class TrafficQueries:
    db: Backend

    async def usage_page(
        self,
        since: float,
        until: float,
        after: tuple[float, str] | None = None,
        *,
        model: str | None = None,
        project: str | None = None,
        limit: int = 2000,
    ) -> list[UsageRecord]:
        """Usage rows completed in [since, until), in (time, id) order, from after the row `after` names
        (time, id) for the next page. Tags are not read: a trace has none."""
        where = ["time >= ?", "time < ?"]
        params: list[object] = [since, until]
        if after is not None:
            where.append("(time > ? OR (time = ? AND id > ?))")
            params += [after[0], after[0], after[1]]
        if model is not None:
            where.append("model = ?")
            params.append(model)
        if project is not None:
            where.append("project = ?")
            params.append(project)
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {USAGE_COLUMNS} FROM usage WHERE {' AND '.join(where)} ORDER BY time, id LIMIT ?",
                [*params, limit],
            )
        return [usage_record(r) for r in rows]

    async def usage_ids_present(self, ids: Sequence[str]) -> int:
        """How many of these usage ids are in the store already (a primary-key lookup per chunk)."""
        found = 0
        async with self.db.tx() as tx:
            for i in range(0, len(ids), _CHUNK):
                part = list(ids[i : i + _CHUNK])
                marks = ", ".join("?" for _ in part)
                found += int(
                    (await tx.fetch(f"SELECT COUNT(*) FROM usage WHERE id IN ({marks})", part))[0][0]
                )
        return found

    async def usage_minutes(
        self, since: float, until: float, *, model: str | None = None, project: str | None = None
    ) -> list[MinuteTotal]:
        """The per-minute aggregates of [since, until), oldest first."""
        where = ["minute >= ?", "minute < ?"]
        params: list[object] = [since, until]
        for column, value in (("model", model), ("project", project)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_MINUTE_COLUMNS} FROM usage_minutes WHERE {' AND '.join(where)} "
                "ORDER BY minute, model, project, source",
                params,
            )
        return [_minute(r) for r in rows]

    async def prune_usage(self, before: float, batch: int = 5000) -> PruneResult:
        """Fold the oldest whole minutes of per-request rows completed before `before` (rounded down to a
        minute) into `usage_minutes` and delete them: about `batch` rows, more only when one minute alone
        holds more. Call again until it returns 0 rows."""
        cutoff = minute_of(before)
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_FINISHED} FROM usage WHERE time < ? ORDER BY time, id LIMIT ?", (cutoff, batch)
            )
            if not rows:
                return PruneResult(0, 0)
            end = cutoff
            if len(rows) == batch:  # more may follow: stop before the last row's minute, or take it whole
                last = minute_of(float(rows[-1][1]))
                end = last if last > minute_of(float(rows[0][1])) else min(last + 60.0, cutoff)
                if end > last:
                    rows = await tx.fetch(
                        f"SELECT {_FINISHED} FROM usage WHERE time < ? ORDER BY time, id", (end,)
                    )
            rows = [r for r in rows if float(r[1]) < end]
            later = await tx.fetch(
                f"SELECT {_FINISHED} FROM usage WHERE time >= ? AND time < ? AND time - latency_ms / 1000.0 < ?",
                (end, end + LOOKAHEAD_S, end),
            )
            totals = aggregate_minutes([_finished(r) for r in rows], [_finished(r) for r in later])
            written = await _upsert_minutes(tx, totals)
            ids = [r[0] for r in rows]
            for i in range(0, len(ids), _CHUNK):
                part = ids[i : i + _CHUNK]
                marks = ", ".join("?" for _ in part)
                await tx.execute(f"DELETE FROM usage_tags WHERE usage_id IN ({marks})", part)
                await tx.execute(f"DELETE FROM usage WHERE id IN ({marks})", part)
        return PruneResult(len(ids), written)

    async def prune_usage_minutes(self, before: float) -> int:
        """Delete the aggregates of minutes before `before`; returns how many."""
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM usage_minutes WHERE minute < ?", (minute_of(before),))


async def _upsert_minutes(tx: Tx, totals: Sequence[MinuteTotal]) -> int:
    """Write the totals, merged with any row already there for the same minute and group (a late row)."""
    if not totals:
        return 0
    first, last = totals[0].minute, max(t.minute for t in totals)
    have = {
        m.key: m
        for m in map(
            _minute,
            await tx.fetch(
                f"SELECT {_MINUTE_COLUMNS} FROM usage_minutes WHERE minute >= ? AND minute <= ?",
                (first, last),
            ),
        )
    }
    for t in totals:
        old = have.get(t.key)
        m = merge_minutes(old, t) if old is not None else t
        await tx.execute(
            f"INSERT INTO usage_minutes ({_MINUTE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (minute, model, project, source) DO UPDATE SET requests = excluded.requests, "
            "errors = excluded.errors, tokens_in = excluded.tokens_in, tokens_out = excluded.tokens_out, "
            "cost = excluded.cost, peak_concurrency = excluded.peak_concurrency",
            (
                m.minute,
                m.model,
                m.project,
                m.source,
                m.requests,
                m.errors,
                m.tokens_in,
                m.tokens_out,
                m.cost,
                m.peak_concurrency,
            ),
        )
    return len(totals)
