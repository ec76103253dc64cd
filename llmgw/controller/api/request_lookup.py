"""The admin API's request lookup and usage totals (scope admin: they say who used what, and a `user` tag names
a person), read from the store every router writes.

`GET /api/v1/requests/{request_id}`: every usage row of that request id, newest first, with the way it went
(endpoint, queue time, time to first token, the endpoints that failed first, the scheduling decision) and its
tags. The row holds the decision (see llmgw_router.path.lookup for why); a request without a usage row (made
without a project's key) or not yet flushed (a router writes usage every second) is in that router's own
buffer, at `GET /requests/{request_id}` on its metrics listener, which the 404 names.

`GET /api/v1/requests/{request_id}/body`: the request's kept bodies (docs/tenancy.md, Bodies kept and replayed),
opened from the content vault under the project its usage row names; `POST .../replay {"model": M}` sends the
kept request to a ready replica of M, straight to its engine as evals are, and answers both answers.

`GET /api/v1/usage?by=project|team|org|key|model|router|person|tag:KEY&since=EPOCH_SECONDS`: the totals `llmgw usage`
prints.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from aiohttp import web

from llmgw.controller.api.guard import error, require_parts
from llmgw.controller.api.usage_summary import UsageParts
from llmgw.controller.loops.evals import EvalError, target_for
from llmgw.controller.parts.fleet import EngineCaller
from llmgw.controller.wire.engine_http import engine_session, post_json
from llmgw.core.errors import LlmgwError
from llmgw.core.traffic.kept_bodies import KIND, KeptBody, answer_words, read_kept, request_json
from llmgw.store import USAGE_GROUPS, StoreError, UsageTotal
from llmgw.store.queries.content import ContentVault
from llmgw.store.queries.request_queries import record_view
from llmgw.store.records import TAG_GROUP_PREFIX

__all__ = [
    "PARTS",
    "REPLAY_PARTS",
    "VAULT",
    "request_body",
    "request_lookup",
    "request_replay",
    "usage_total_json",
    "usage_totals",
]

PARTS: web.AppKey[UsageParts] = web.AppKey("request_lookup_parts")
REPLAY_PARTS: web.AppKey[EngineCaller] = web.AppKey("request_replay_parts")
VAULT: web.AppKey[ContentVault | None] = web.AppKey("request_body_vault")  # None: no content key
REPLAY_TIMEOUT_S = 120.0


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


async def _kept(request: web.Request, c: UsageParts) -> KeptBody | web.Response:
    """The request's kept bodies, or the error that says why there are none."""
    request_id = request.match_info["request_id"]
    vault = request.app[VAULT]
    if vault is None:
        return error(409, "this controller has no content_key_file: it can open no kept body")
    try:
        rows = await c.store.usage_by_request(request_id)
        for project in dict.fromkeys(r.project for r in rows if r.project):
            opened = await vault.get(KIND, project, request_id, c.wall())
            if opened is not None:
                return read_kept(opened.data)
    except StoreError as exc:
        return error(503, f"the store is unavailable: {exc}")
    except (LlmgwError, ValueError) as exc:  # sealed under another key, altered, or not a body record
        return error(500, f"the kept body of {request_id!r} cannot be read: {exc}")
    return error(
        404,
        f"no body kept for request {request_id!r}: its project keeps none (retention.bodies), it was not in "
        "the share kept, or it is past its TTL (kept bodies are deleted then)",
    )


def _kept_view(kept: KeptBody) -> dict[str, Any]:
    return {**dataclasses.asdict(kept), "answer_text": answer_words(kept.answer, kept.stream)}


async def request_body(request: web.Request) -> web.Response:
    c = require_parts(request, "admin", PARTS)
    kept = await _kept(request, c)
    if isinstance(kept, web.Response):
        return kept
    return web.json_response(_kept_view(kept))


async def request_replay(request: web.Request) -> web.Response:
    """`{"model": M}`: the kept request sent to a ready replica of M (not streamed), and both answers."""
    c = require_parts(request, "admin", REPLAY_PARTS)
    try:
        asked = await request.json()
    except ValueError:
        asked = None
    if not isinstance(asked, dict) or not isinstance(asked.get("model"), str):
        return error(400, 'body must be {"model": MODEL}: the model to replay the kept request on')
    kept = await _kept(request, request.app[PARTS])
    if isinstance(kept, web.Response):
        return kept
    d = c.desired
    entry = d.resolve(asked["model"]) if d is not None else None
    if entry is None:
        return error(404, f"model {asked['model']!r} is not in the applied revision")
    try:
        body = request_json(kept)
        target = target_for(c, entry.name, None)
    except (ValueError, EvalError) as exc:
        return error(409, str(exc))
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    async with engine_session() as session:
        answer, failed = await post_json(
            session, target, path, {**body, "model": target.model}, REPLAY_TIMEOUT_S
        )
    replayed = None if answer is None else json.dumps(answer)
    return web.json_response(
        {
            "request_id": kept.request_id,
            "original": _kept_view(kept),
            "replay": {
                "model": entry.name,
                "replica": target.replica,
                "answer": answer,
                "answer_text": answer_words(replayed, False),
                "error": failed,
            },
        }
    )
