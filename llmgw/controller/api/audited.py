"""The admin API's audit: every call with an admin token that changes something is written to the audit log
(`audited`, wrapped around each non-GET scoped route by `admin_routes.add_routes`), and the read endpoints
`GET /api/v1/audit` and `GET /api/v1/notifications` (scope plan).

An entry says who (the token's name), what the client said of itself (`actor` in an apply's body, else the
`X-Llmgw-Actor` header; recorded, not trusted), the action, the object, and the outcome: accepted (2xx) or
refused with the error message the caller was given. Never a secret: a created key's plaintext is in the
201 body only, which the audit never reads (it reads error bodies). A call without a known token (401) is not
audited: there is no actor to name, and anyone could fill the log with them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from llmgw.controller.api.guard import PERSON, PRINCIPAL, error, require_parts
from llmgw.controller.parts.admin_tokens import AdminPrincipal, AdminTokens
from llmgw.controller.parts.audit import AuditLog
from llmgw.controller.parts.settings import ControllerOptions
from llmgw.core.security import bearer_token
from llmgw.store import AuditEntry, Delivery, StoreError
from llmgw.store.db import shareable_dsn
from llmgw.store.store import Store

log = logging.getLogger("llmgw.controller.api.admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# What a changing handler tells the audit: the object it acted on, the action when it is more than the
# route's (apply.force), and what the client said of itself.
AUDIT_OBJECT: web.RequestKey[str] = web.RequestKey("audit_object", str)
AUDIT_ACTION: web.RequestKey[str] = web.RequestKey("audit_action", str)
AUDIT_DETAIL: web.RequestKey[str] = web.RequestKey("audit_detail", str)
ACTOR_HEADER = "X-Llmgw-Actor"
DETAIL_MAX = 200
REASON_MAX = 500
LIST_MAX = 1000

# The action each changing route records; a route missing here is recorded by its method and path.
ACTIONS: dict[tuple[str, str], str] = {
    ("POST", "/api/v1/apply"): "apply",
    ("POST", "/api/v1/restart"): "restart",
    ("POST", "/api/v1/nodes/{node}/drain"): "node.drain",
    ("POST", "/api/v1/nodes/{node}/uncordon"): "node.uncordon",
    ("POST", "/api/v1/facility/holds/{domain}"): "facility.hold",
    ("POST", "/api/v1/facility/holds/{domain}/release"): "facility.release",
    ("POST", "/api/v1/keys"): "key.create",
    ("POST", "/api/v1/keys/{key_id}/revoke"): "key.revoke",
    ("POST", "/api/v1/nodes/{node}/doctor"): "node.doctor",
    ("POST", "/api/v1/upgrade"): "fleet.upgrade",
    ("GET", "/api/v1/credentials/router"): "credential.router",
    ("GET", "/api/v1/credentials/node/{node}"): "credential.node",
    ("GET", "/api/v1/store"): "store.location",
}
# Reads that hand out a credential: audited like a change, so the log says which admin took a router's or a
# node's token (it opens what that holder opens).
AUDITED_READS = frozenset({"/api/v1/credentials/router", "/api/v1/credentials/node/{node}", "/api/v1/store"})


class AuditParts(Protocol):
    """What the audit trail, the notification outbox and the store's location read: who a token is, the audit
    log, the store, the settings (the store as configured) and the wall clock."""

    @property
    def admin_tokens(self) -> AdminTokens: ...

    @property
    def audit(self) -> AuditLog: ...

    @property
    def store(self) -> Store: ...

    @property
    def settings(self) -> ControllerOptions: ...

    @property
    def wall(self) -> Callable[[], float]: ...


PARTS: web.AppKey[AuditParts] = web.AppKey("audit_parts")


def action_of(method: str, path: str) -> str:
    return ACTIONS.get((method, path), f"{method} {path}")


def _reason(status: int, body: bytes | None) -> str:
    """The message the caller was told, from the API's `{"error": {"message": ...}}` body."""
    message = ""
    try:
        parsed = json.loads(body or b"")
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            message = str(parsed["error"].get("message") or "")
    except ValueError:
        pass
    return f"{status}: {message}"[:REASON_MAX] if message else f"HTTP {status}"


def _actor(request: web.Request, c: AuditParts) -> AdminPrincipal | None:
    if PRINCIPAL in request:
        return request[PRINCIPAL]
    if PERSON in request:  # a person's own key: audited under their name (the scope is not theirs to use)
        return AdminPrincipal(f"person:{request[PERSON]}", "plan")
    presented = bearer_token(request.headers.get("Authorization"))
    return c.admin_tokens.principal(presented) if presented is not None else None  # a 403: known, not allowed


def _record(request: web.Request, action: str, status: int, body: bytes | None) -> None:
    c = request.app[PARTS]
    principal = _actor(request, c)
    if principal is None:
        return
    detail = str(request.get(AUDIT_DETAIL) or request.headers.get(ACTOR_HEADER, ""))
    c.audit.record(
        AuditEntry(
            time=c.wall(),
            actor=principal.name,
            action=request.get(AUDIT_ACTION) or action,
            object=request.get(AUDIT_OBJECT)
            or request.match_info.get("key_id", "")
            or request.match_info.get("node", ""),
            outcome="accepted" if status < 400 else "refused",
            reason="" if status < 400 else _reason(status, body),
            actor_detail=detail.strip()[:DETAIL_MAX],
            via="admin-api",
        )
    )


def audited(action: str, handler: Handler) -> Handler:
    """`handler` (already behind its scope check) with its outcome written to the audit log."""

    async def recorded(request: web.Request) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            _record(request, action, exc.status, exc.text.encode() if exc.text else None)
            raise
        except Exception:
            _record(request, action, 500, b'{"error": {"message": "internal error in the controller"}}')
            raise
        body = response.body if isinstance(response, web.Response) and response.status >= 400 else None
        _record(request, action, response.status, body if isinstance(body, bytes) else None)
        return response

    return recorded


# ------------------------------------------------------------------------------------------------ reads


def whole_number(text: str, low: int, high: int) -> int | None:
    """`text` as a whole number from `low` to `high`, else None: a query's limit out of range is refused, never
    quietly clamped (the caller would take a short list for all there is)."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if low <= value <= high else None


def _limit(request: web.Request) -> int:
    limit = whole_number(request.query.get("limit", "200"), 1, LIST_MAX)
    if limit is None:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": {"message": f"limit must be a whole number from 1 to {LIST_MAX}"}}),
            content_type="application/json",
        )
    return limit


def audit_json(e: AuditEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "time": e.time,
        "actor": e.actor,
        "actor_detail": e.actor_detail,
        "action": e.action,
        "object": e.object,
        "outcome": e.outcome,
        "reason": e.reason,
        "via": e.via,
    }


async def audit(request: web.Request) -> web.Response:
    """`?since=EPOCH_SECONDS&actor=NAME&limit=N`: entries newest first."""
    c = require_parts(request, "plan", PARTS)
    since: float | None = None
    if "since" in request.query:
        try:
            since = float(request.query["since"])
        except ValueError:
            return error(400, "since must be a time in seconds since the epoch (llmgw audit --since 1d)")
    try:
        found = await c.store.list_audit(since, request.query.get("actor") or None, _limit(request))
    except StoreError as exc:
        return error(503, f"the store is unavailable: {exc}")
    return web.json_response({"entries": [audit_json(e) for e in found], "unwritten": len(c.audit.pending)})


def delivery_json(d: Delivery) -> dict[str, Any]:
    return {
        "id": d.id,
        "notification": d.notification,
        "event": d.event,
        "object": d.object,
        "created_at": d.created_at,
        "attempts": d.attempts,
        "next_at": None if d.dead_at else d.next_at,
        "last_error": d.last_error,
        "dead_at": d.dead_at,
        "body": d.body,
    }


async def notifications(request: web.Request) -> web.Response:
    """`?dead=1`: only dead letters; `?dead=0`: only those waiting; neither: both, oldest first."""
    c = require_parts(request, "plan", PARTS)
    asked = request.query.get("dead")
    dead = None if asked is None else {"1": True, "true": True, "0": False, "false": False}.get(asked.lower())
    if asked is not None and dead is None:
        return error(400, f"dead={asked!r}: true (only dead letters), false (only those waiting) or left out")
    try:
        # Counts first: the list read after them is never older than they are (a delivery dying meanwhile
        # shows in the list, not only in the count).
        waiting, dead_count = await c.store.delivery_counts()
        found = await c.store.list_deliveries(dead, _limit(request))
    except StoreError as exc:
        return error(503, f"the store is unavailable: {exc}")
    return web.json_response(
        {"deliveries": [delivery_json(d) for d in found], "waiting": waiting, "dead": dead_count}
    )


async def store_location(request: web.Request) -> web.Response:
    """Where this controller's store is, for the CLI's store commands (`llmgw usage`, `traffic`, `store`) run
    elsewhere: a `@file` reference as configured (the DSN stays in the file), a SQLite file's absolute path,
    a PostgreSQL DSN without its password (libpq's PGPASSWORD or ~/.pgpass gives it)."""
    c = request.app[PARTS]
    shown = shareable_dsn(c.store.dsn, configured=c.settings.store)
    return web.json_response({"store": shown, "dialect": c.store.dsn.dialect})
