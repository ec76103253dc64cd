"""The admin API's one check and one error shape.

`scoped` is the route table's check (llmgw.controller.api.routes wraps every scoped route in it): the caller's
token must have the route's scope, else 401 (no known token) or 403 (naming the scope needed). A handler reaches
the parts it reads through `require_parts(request, scope, PARTS)`, which fails closed: a handler whose route lost
its scope check answers 401, never serves. Every error is `{"error": {"message": ...}}` (`error`, and `json_errors` for aiohttp's
own and for a bug).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from aiohttp import web

from llmgw.controller.parts.admin_tokens import AdminPrincipal, AdminTokens, Scope, allows
from llmgw.core.errors import LlmgwError, TransientError
from llmgw.core.security import bearer_token
from llmgw.store.errors import StoreError

__all__ = [
    "PEOPLE",
    "PERSON",
    "PRINCIPAL",
    "TOKENS",
    "Handler",
    "PersonFinder",
    "error",
    "json_errors",
    "person_or_scoped",
    "principal",
    "require_parts",
    "scoped",
]

log = logging.getLogger("llmgw.controller.api.admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Who is calling, set by `scoped` once the token's scope is checked.
PRINCIPAL: web.RequestKey[AdminPrincipal] = web.RequestKey("principal", AdminPrincipal)
# Or, on a route people may call too (`person_or_scoped`), the Person whose own active key was presented: what
# they may do there is their role's (llmgw.core.tenancy.people.may), which the route's handler asks.
PERSON: web.RequestKey[str] = web.RequestKey("person", str)


class PersonFinder(Protocol):
    """Whose own key a bearer token is: the Person's name while the key is active and they are declared."""

    async def person_of_key(self, token: str) -> str | None: ...


PEOPLE: web.AppKey[PersonFinder] = web.AppKey("people", PersonFinder)


class TokenHolder(Protocol):
    """Who holds the admin tokens the check asks (the Controller: read at each request)."""

    @property
    def admin_tokens(self) -> AdminTokens: ...


TOKENS: web.AppKey[TokenHolder] = web.AppKey("admin_token_holder")


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _unknown_token() -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(
        text='{"error": {"message": "admin token required: Authorization: Bearer <token>"}}',
        content_type="application/json",
    )


def _allowed(request: web.Request, principal: AdminPrincipal, need: Scope) -> AdminPrincipal:
    """`principal` when its scope covers `need`, else 403 naming both."""
    if not allows(principal.scope, need):
        message = (
            f"token {principal.name!r} has scope {principal.scope}; {request.method} {request.path} needs "
            f"scope {need} (scopes: plan reads, apply also applies revisions, admin does everything; "
            "see docs/controller.md, Admin tokens)"
        )
        raise web.HTTPForbidden(
            text=json.dumps({"error": {"message": message, "scope": principal.scope, "needs": need}}),
            content_type="application/json",
        )
    return principal


def _caller(request: web.Request, need: Scope) -> AdminPrincipal:
    """Who is calling, when their token has scope `need`; else 401 or 403."""
    presented = bearer_token(request.headers.get("Authorization"))
    tokens = request.app[TOKENS].admin_tokens
    found = tokens.principal(presented) if presented is not None else None
    if found is None:
        raise _unknown_token()
    return _allowed(request, found, need)


def scoped(need: Scope, handler: Handler) -> Handler:
    """`handler` behind the check that the caller's token has scope `need` (the route table's)."""

    async def checked(request: web.Request) -> web.StreamResponse:
        request[PRINCIPAL] = _caller(request, need)
        return await handler(request)

    return checked


def person_or_scoped(need: Scope, handler: Handler) -> Handler:
    """`handler` behind the check that the caller holds an admin token of scope `need`, or is a person
    presenting their own active key (`PERSON`; the handler then checks their role). A token that is neither
    is 401, as on every route."""

    async def checked(request: web.Request) -> web.StreamResponse:
        presented = bearer_token(request.headers.get("Authorization"))
        if presented is None or request.app[TOKENS].admin_tokens.principal(presented) is not None:
            request[PRINCIPAL] = _caller(request, need)
        else:
            person = await request.app[PEOPLE].person_of_key(presented)
            if person is None:
                raise web.HTTPUnauthorized(
                    text='{"error": {"message": "an admin token or a person\'s own active key required: '
                    'Authorization: Bearer <token>"}}',
                    content_type="application/json",
                )
            request[PERSON] = person
        return await handler(request)

    return checked


def principal(request: web.Request) -> AdminPrincipal:
    """Who is calling, for a handler behind the route table's check (401 without one: fails closed)."""
    if PRINCIPAL not in request:
        raise _unknown_token()
    return request[PRINCIPAL]


Parts = TypeVar("Parts")


def require_parts(request: web.Request, scope: Scope, key: web.AppKey[Parts]) -> Parts:
    """What the composition root (app.py) put under `key`, typed as the protocol naming the parts the handler
    reads, for a handler whose route needs `scope`: the route table's check ran and the caller's token has that
    scope; else 401 or 403 (fails closed if a route lost its check)."""
    _allowed(request, principal(request), scope)
    return request.app[key]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error from this app is JSON (`{"error": {"message": ...}}`), including aiohttp's own 404, 405
    and 413, and a bug is a 500 with no traceback in the body (it goes to the log)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        if exc.status == 404:
            message = f"no such endpoint: {request.method} {request.path} (see docs/controller.md)"
        elif exc.status == 405:
            message = (
                f"{request.method} is not allowed on {request.path}; allowed: {exc.headers.get('Allow', '')}"
            )
        elif exc.status == 413:
            message = f"request body too large (the limit is {request.app._client_max_size} bytes)"
        else:
            message = exc.reason
        keep = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
        return web.json_response({"error": {"message": message}}, status=exc.status, headers=keep)
    except ConnectionResetError:
        # The client went away while sending its body: nobody is left to answer, and it is not our error.
        log.info("admin request %s %s: the client went away", request.method, request.path)
        return web.Response(status=400)
    except LlmgwError as exc:
        return _llmgw_error(request, exc)
    except Exception:
        log.exception("admin request %s %s failed", request.method, request.path)
        return error(500, "internal error in the controller (its log has the details)")


def _llmgw_error(request: web.Request, exc: LlmgwError) -> web.Response:
    """An llmgw error no handler answered. Worth asking again (transient, or the store's) is 503, with
    Retry-After when the error says how long; anything else is 500 with its message (written to be read),
    the traceback in the log."""
    if isinstance(exc, TransientError | StoreError):
        message = f"the store is unavailable: {exc}" if isinstance(exc, StoreError) else str(exc)
        delay = exc.delay if isinstance(exc, TransientError) else None
        headers = {} if delay is None else {"Retry-After": str(math.ceil(delay))}
        return web.json_response({"error": {"message": message}}, status=503, headers=headers)
    log.error("admin request %s %s failed: %s", request.method, request.path, exc, exc_info=exc)
    return error(500, str(exc))
