"""The admin API's request lookup and usage totals (scope admin: they say who used what, and a `user` tag names
a person), read from the store every router writes.

`GET /api/v1/requests/{request_id}`: every usage row of that request id, newest first, with the way it went
(endpoint, queue time, time to first token, the endpoints that failed first, the scheduling decision) and its
tags. The row holds the decision (see llmgw_router.path.lookup for why); a request without a usage row (made
without a project's key) or not yet flushed (a router writes usage every second) is in that router's own
buffer, at `GET /requests/{request_id}` on its metrics listener, which the 404 names.

`GET /api/v1/usage?by=project|team|org|key|model|router|person|tag:KEY&since=EPOCH_SECONDS`: the totals `llmgw usage`
prints.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llmgw.controller.api.guard import error, require_parts
from llmgw.controller.api.usage_summary import UsageParts
from llmgw.store import USAGE_GROUPS, StoreError, UsageTotal
from llmgw.store.queries.request_queries import record_view
from llmgw.store.records import TAG_GROUP_PREFIX

__all__ = ["PARTS", "request_lookup", "usage_total_json", "usage_totals"]

PARTS: web.AppKey[UsageParts] = web.AppKey("request_lookup_parts")


async def request_lookup(request: web.Request) -> web.Response:
    c = require_parts(request, "admin", PARTS)
    request_id = request.match_info["request_id"]
    try:
        found = await c.store.usage_by_request(request_id)
    except StoreError as exc:
        return error(503, f"the store is unavailable: {exc}")
    if not found:
        return error(
            404,
            f"no usage row for request {request_id!r}: routers write usage within about a second of the "
            "answer, and a request made without a project's key has no row (the router that served it keeps "
            "the last requests at GET /requests/ID on its metrics listener: `llmgw request ID --router URL`)",
        )
    return web.json_response({"requests": [record_view(r) for r in found]})


def usage_total_json(t: UsageTotal, by: str) -> dict[str, Any]:
    """One group's totals; an absent group (no key, no such tag) is null, never an empty name."""
    row: dict[str, Any] = {"group": t.group or None}
    if by == "key":
        row |= {"key_name": t.key_name, "key_project": t.key_project}
    return row | {
        "requests": t.requests,
        "errors": t.errors,
        "tokens_in": t.tokens_in,
        "tokens_out": t.tokens_out,
        "cost": t.cost,
        "avg_latency_ms": t.avg_latency_ms,
    }


async def usage_totals(request: web.Request) -> web.Response:
    c = require_parts(request, "admin", PARTS)
    by = request.query.get("by", "project")
    since: float | None = None
    if "since" in request.query:
        try:
            since = float(request.query["since"])
        except ValueError:
            return error(400, "since must be a time in seconds since the epoch (llmgw usage --since 1d)")
    tag = by.removeprefix(TAG_GROUP_PREFIX) if by.startswith(TAG_GROUP_PREFIX) else None
    if tag is None and by not in USAGE_GROUPS:
        return error(400, f"by={by!r}: expected one of {', '.join(USAGE_GROUPS)} or tag:KEY (tag:app)")
    if tag is not None and not tag:
        return error(400, "by=tag: names no tag key; e.g. by=tag:app")
    try:
        if tag is not None:
            totals = await c.store.usage_totals_by_tag(tag, since=since)
        else:
            totals = await c.store.usage_totals(by, since=since)  # type: ignore[arg-type]  # checked above
    except StoreError as exc:
        return error(503, f"the store is unavailable: {exc}")
    return web.json_response({"by": by, "totals": [usage_total_json(t, by) for t in totals]})
