"""One request looked up by its id, and usage grouped by a request tag: the store's queries for them, mixed
into `Store`.

Tags live in `usage_tags` (one row per tag) rather than in a JSON column, so grouping by one is a plain join
that SQLite and PostgreSQL read alike.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import orjson

from llmgw.store.records import UsageBucket, UsageRecord, UsageTotal

if TYPE_CHECKING:  # annotations only: a router imports `record_view` without loading sqlite3 or psycopg
    from llmgw.store.db import Backend, Row

USAGE_COLUMNS = (
    "id, time, request_id, project, team, org, key_id, model, tokens_in, tokens_out, cost, latency_ms, "
    "status, fallback_used, router_id, endpoint, queue_ms, ttft_ms, attempts, decision, code, stream, prefix, "
    "guard, person"
)
LOOKUP_MAX = 50  # rows one request id may return (a client's own ids can repeat)


def usage_record(r: Row, tags: dict[str, str] | None = None) -> UsageRecord:
    return UsageRecord(
        id=r[0],
        time=r[1],
        request_id=r[2],
        project=r[3],
        team=r[4],
        org=r[5],
        key_id=r[6],
        model=r[7],
        tokens_in=r[8],
        tokens_out=r[9],
        cost=r[10],
        latency_ms=r[11],
        status=r[12],
        fallback_used=bool(r[13]),
        router_id=r[14],
        endpoint=r[15],
        queue_ms=float(r[16]) if r[16] is not None else None,
        ttft_ms=float(r[17]) if r[17] is not None else None,
        attempts=_json_or_none(r[18]),
        decision=_json_or_none(r[19]),
        code=r[20],
        tags=tags or None,
        stream=bool(r[21]) if r[21] is not None else None,
        prefix=r[22],
        guard=_json_or_none(r[23]),
        person=r[24],
    )


def json_column(value: object) -> str:
    """A usage row's JSON column (attempts, decision, guard) as written: orjson's text (json.dumps cost about
    30,000 instructions per small dict, most of a row's encoding), or json's where orjson would write another
    value (a NaN or an infinity, which it writes as null) or cannot write one (an integer beyond 64 bits, a
    lone surrogate, a key that is not a string). Read back by `_json_or_none`, the same value either way."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"))
    if b"null" in text and _holds_non_finite(value):
        return json.dumps(value, separators=(",", ":"))
    return text.decode()


def _holds_non_finite(value: object) -> bool:
    """Whether a NaN or an infinity is among `value`'s floats (lists, tuples and dicts walked, no recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None  # a column written by hand that is not JSON: unknown


def record_view(rec: UsageRecord) -> dict[str, Any]:
    """A usage record as the admin API and `llmgw request` show it (the JSON fields decoded)."""
    return {
        "request_id": rec.request_id,
        "time": rec.time,
        "project": rec.project or None,
        "team": rec.team or None,
        "org": rec.org or None,
        "key_id": rec.key_id,
        "model": rec.model,
        "status": rec.status,
        "code": rec.code or None,
        "endpoint": rec.endpoint or None,
        "queue_ms": rec.queue_ms,
        "ttft_ms": rec.ttft_ms,
        "duration_ms": rec.latency_ms,
        "tokens_in": rec.tokens_in,
        "tokens_out": rec.tokens_out,
        "cost": rec.cost,
        "fallback_used": rec.fallback_used,
        "attempts": rec.attempts or [],
        "decision": rec.decision,
        "tags": rec.tags or {},
        "guard": rec.guard,
        "router_id": rec.router_id,
    }


class RequestQueries:
    db: Backend

    async def usage_per_bucket(
        self, since: float, until: float, bucket_s: float, project: str | None = None
    ) -> list[UsageBucket]:
        """Usage in [since, until) summed per `bucket_s` bucket, project, model and key: what a chart over
        time needs, from every row rather than the newest few. Buckets count from `since`."""
        if bucket_s <= 0 or until <= since:
            raise ValueError(
                f"usage buckets need bucket_s > 0 and until > since (got {bucket_s}, {since}, {until})"
            )
        # SQLite's CAST truncates, which is the floor here (time >= since); PostgreSQL's rounds, hence FLOOR.
        offset = "(time - ?) / ?"
        bucket = (
            f"CAST({offset} AS INTEGER)"
            if self.db.dialect == "sqlite"
            else f"CAST(FLOOR({offset}) AS BIGINT)"
        )
        where = "time >= ? AND time < ?"
        params: list[float | str] = [since, bucket_s, since, until]
        if project is not None:
            where, params = where + " AND project = ?", [*params, project]
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {bucket}, project, model, key_id, COUNT(*), "
                "CAST(COALESCE(SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END), 0) AS BIGINT), "
                "CAST(COALESCE(SUM(tokens_in), 0) AS BIGINT), CAST(COALESCE(SUM(tokens_out), 0) AS BIGINT), "
                "CAST(COALESCE(SUM(cost), 0) AS DOUBLE PRECISION) "
                f"FROM usage WHERE {where} GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4",
                tuple(params),
            )
        return [
            UsageBucket(int(r[0]), r[1], r[2], r[3], int(r[4]), int(r[5]), int(r[6]), int(r[7]), float(r[8]))
            for r in rows
        ]

    async def usage_by_request(self, request_id: str, limit: int = LOOKUP_MAX) -> list[UsageRecord]:
        """Every usage row of one request id, newest first, each with its tags. Usually one; a client that
        sends its own x-request-id may reuse it, and every request it made then is shown."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {USAGE_COLUMNS} FROM usage WHERE request_id = ? ORDER BY time DESC, id DESC LIMIT ?",
                (request_id, limit),
            )
            tags: dict[str, dict[str, str]] = defaultdict(dict)
            if rows:
                marks = ", ".join("?" for _ in rows)
                found = await tx.fetch(
                    f"SELECT usage_id, key, value FROM usage_tags WHERE usage_id IN ({marks})",
                    [r[0] for r in rows],
                )
                for usage_id, key, value in found:
                    tags[usage_id][key] = value
        return [usage_record(r, tags.get(r[0])) for r in rows]

    async def usage_totals_by_tag(
        self, key: str, since: float | None = None, until: float | None = None
    ) -> list[UsageTotal]:
        """Totals grouped by the value of tag `key`. Requests without that tag form one group whose `group`
        is "" (a tag's value is never empty: the router refuses that), which callers show as untagged."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT COALESCE(t.value, ''), COUNT(*), CAST(COALESCE(SUM(u.tokens_in), 0) AS BIGINT), "
                "CAST(COALESCE(SUM(u.tokens_out), 0) AS BIGINT), "
                "CAST(COALESCE(SUM(u.cost), 0) AS DOUBLE PRECISION), "
                "CAST(COALESCE(AVG(u.latency_ms), 0) AS DOUBLE PRECISION), "
                "CAST(COALESCE(SUM(CASE WHEN u.status >= 400 THEN 1 ELSE 0 END), 0) AS BIGINT) "
                "FROM usage u LEFT JOIN usage_tags t ON t.usage_id = u.id AND t.key = ? "
                "WHERE u.time >= ? AND u.time < ? GROUP BY 1 ORDER BY 1",
                (
                    key,
                    since if since is not None else float("-inf"),
                    until if until is not None else float("inf"),
                ),
            )
        return [
            UsageTotal(str(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]), float(r[5]), int(r[6]))
            for r in rows
        ]
