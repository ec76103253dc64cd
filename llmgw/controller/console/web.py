"""The console's HTTP shell: sessions in cookies, the CSRF check, the security headers, rendering, login.

Every page goes through `guarded`: no session (or an expired one) is sent to the login page (htmx's own
requests get a 401 with `HX-Redirect`), a POST without the session's CSRF token is refused with 403, and a
session without the access a page needs gets a 403 page that says what it would need.
"""

from __future__ import annotations

import html
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal, Protocol

import jinja2
from aiohttp import web

from llmgw.adapters import keys as keymod
from llmgw.controller.console.facts import PlanCache
from llmgw.controller.console.sessions import (
    COOKIE,
    KEY_RECHECK_S,
    LOGIN_COOKIE,
    Session,
    Sessions,
    cookie_secure,
    csrf_ok,
    tenant_session_stays,
)
from llmgw.controller.parts.admin_tokens import AdminTokens
from llmgw.controller.parts.audit import AuditLog
from llmgw.controller.parts.fleet import StatusReader
from llmgw.controller.parts.hub import AgentHub
from llmgw.core.security import is_loopback_host
from llmgw.store import StoreError
from llmgw.store.store import Store

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Asked on every request of a live session: False ends it (a person the repo no longer declares, say).
SessionCheck = Callable[[web.Request, Session], Awaitable[bool]]
# plan: an admin token of any scope; admin: an admin-scope token; tenant: a tenant, or an admin-scope token
# (usage says who used what, as the admin API's usage needs admin); person: a person signed in as themselves;
# any: anyone logged in.
Access = Literal["plan", "admin", "tenant", "person", "any"]
SESSION: web.RequestKey[Session] = web.RequestKey("console_session", Session)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATIC_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".json": "application/json",
}


@dataclass
class ConsoleState:
    sessions: Sessions
    router_url: str | None  # the router the chat page sends to (`llmgw up` sets its own)
    templates: jinja2.Environment = field(repr=False)
    static: dict[str, bytes] = field(default_factory=dict, repr=False)
    plan: PlanCache = field(default_factory=PlanCache)
    checks: list[SessionCheck] = field(default_factory=list)


CONSOLE: web.AppKey[ConsoleState] = web.AppKey("console", ConsoleState)


class ConsoleParts(StatusReader, Protocol):
    """What the console reads besides a StatusReader (its facts are the status views'): the store (keys,
    usage, events), who a token is, the audit log, the hub (node logs), events it records, and whether this
    controller leads."""

    @property
    def store(self) -> Store: ...

    @property
    def admin_tokens(self) -> AdminTokens: ...

    @property
    def audit(self) -> AuditLog: ...

    @property
    def hub(self) -> AgentHub: ...

    async def event(self, kind: str, obj: str, message: str) -> None: ...

    def leading(self) -> bool: ...

    def reserved_secret_names(self) -> frozenset[str]: ...


CONSOLE_PARTS: web.AppKey[ConsoleParts] = web.AppKey("console_parts")


def make_state(c: ConsoleParts) -> ConsoleState:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("llmgw.controller.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a misspelt field is an error in the tests, not an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # The macros as globals: a live region rendered on its own (htmx's polling) sees no template's imports.
    macros = env.get_template("_macros.html").module
    for name, macro in (
        ("pager", "pager"),
        ("hbadge", "health"),
        ("sbadge", "state"),
        ("log_lines", "log_lines"),
    ):
        env.globals[name] = getattr(macros, macro)
    env.filters["ago"] = _ago(c)
    env.filters["bytes"] = _bytes
    env.filters["when"] = _when
    static = {
        f.name: f.read_bytes()
        for f in resources.files("llmgw.controller.console").joinpath("static").iterdir()
        if f.is_file()
    }
    return ConsoleState(
        Sessions(c.wall, c.settings.console_session_s), c.settings.console_router_url, env, static
    )


def _ago(c: ConsoleParts) -> Callable[[float | None], str]:
    def ago(at: float | None) -> str:
        if at is None:
            return "never"
        s = max(0.0, c.wall() - at)
        return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"

    return ago


def _bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _when(at: float | None) -> str:
    import time

    return "—" if at is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def secure(response: web.StreamResponse) -> web.StreamResponse:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def render(request: web.Request, template: str, code: int = 200, **values: Any) -> web.Response:
    """The page, or, for htmx's polling of the `live` region, only that region."""
    state = request.app[CONSOLE]
    tmpl = state.templates.get_template(template)
    session = request.get(SESSION)
    ctx = {"session": session, "path": request.path, "qs": request.query_string, **values}
    if request.headers.get("HX-Request") == "true" and request.headers.get("HX-Target") == "live":
        block = tmpl.blocks.get("live")  # a page with nothing live (chat) has an empty region
        body = "" if block is None else "".join(block(tmpl.new_context(ctx)))
    else:
        body = tmpl.render(ctx)
    return web.Response(text=body, content_type="text/html", charset="utf-8", status=code)


def controller(request: web.Request) -> ConsoleParts:
    return request.app[CONSOLE_PARTS]


def session_of(request: web.Request) -> Session:
    return request[SESSION]


def _may(session: Session, access: Access) -> bool:
    if access == "any":
        return True
    if access == "tenant":
        return session.kind == "tenant" or session.may("admin")
    if access == "person":
        return session.kind == "person"
    return session.kind == "admin" and session.may(access)


def _need_words(access: Access) -> str:
    return {
        "plan": "an admin token (any scope)",
        "admin": "an admin token of scope admin",
        "tenant": "a project key, or an admin token of scope admin",
        "person": "signing in as a person (your own threads and notes)",
        "any": "a login",
    }[access]


def guarded(access: Access, handler: Handler) -> Handler:
    async def checked(request: web.Request) -> web.StreamResponse:
        state = request.app[CONSOLE]
        session, expired = state.sessions.get(request.cookies.get(COOKIE))
        if session is not None and not await _session_stays(request, session):
            state.sessions.close(session.id)
            session, expired = None, True
        if session is None:
            return secure(_to_login(request, expired))
        request[SESSION] = session
        if request.method == "POST" and not await _csrf_presented(request, session):
            return secure(
                render(
                    request,
                    "error.html",
                    403,
                    title="Refused",
                    message=(
                        "this form carries no valid CSRF token for your session (reload the page and try again)"
                    ),
                )
            )
        if not _may(session, access):
            message = f"{request.path} needs {_need_words(access)}; you are logged in as {session.who}"
            return secure(render(request, "error.html", 403, title="Not for this login", message=message))
        if request.method == "POST" and not c_leading(request):
            return secure(
                render(
                    request,
                    "error.html",
                    503,
                    title="Standby",
                    message=("this controller is a standby (read-only): changes are made on the leader"),
                )
            )
        return secure(await handler(request))

    return checked


async def _session_stays(request: web.Request, session: Session) -> bool:
    if not await _key_still_active(request, session):
        return False
    for check in request.app[CONSOLE].checks:
        if not await check(request, session):
            return False
    return True


async def _key_still_active(request: web.Request, session: Session) -> bool:
    """A tenant's session lasts only while its key does: looked up again every KEY_RECHECK_S."""
    now = request.app[CONSOLE].sessions.wall()
    if session.kind != "tenant" or session.key is None or now - session.key_checked_at < KEY_RECHECK_S:
        return True
    c = controller(request)
    try:
        found = await keymod.lookup(c.store, session.key, now)
    except (
        StoreError
    ):  # says nothing about the key: open for a grace, then closed (sessions.tenant_session_stays)
        return tenant_session_stays(session, now, None, c.settings.console_store_grace_s)
    active = found is not None and found.state == "active"
    if active:
        session.key_checked_at = now
    return tenant_session_stays(session, now, active, c.settings.console_store_grace_s)


def c_leading(request: web.Request) -> bool:
    return controller(request).leading()


async def _csrf_presented(request: web.Request, session: Session) -> bool:
    presented = request.headers.get("X-CSRF-Token")
    if presented is None and request.content_type in (
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ):
        form = await request.post()
        value = form.get("csrf")
        presented = value if isinstance(value, str) else None
    return csrf_ok(session, presented)


def _to_login(request: web.Request, expired: bool) -> web.Response:
    where = "/ui/login" + ("?expired=1" if expired else "")
    if request.headers.get("HX-Request") == "true" or request.method != "GET":
        message = "your console session expired: log in again" if expired else "log in first"
        return web.Response(text=html.escape(message), status=401, headers={"HX-Redirect": where})
    raise web.HTTPSeeOther(where)


def cookie_is_secure(request: web.Request) -> bool:
    settings = controller(request).settings
    loopback = is_loopback_host(settings.listen_hostport[0])
    return cookie_secure(settings.console_cookie_secure, request.secure, loopback)


def set_session_cookie(response: web.StreamResponse, session: Session, request: web.Request) -> None:
    response.set_cookie(
        COOKIE,
        session.id,
        max_age=max(1, int(session.expires_at - request.app[CONSOLE].sessions.wall())),
        path="/ui/",
        httponly=True,
        samesite="Strict",
        secure=cookie_is_secure(request),
    )


# ------------------------------------------------------------------------------------------------ login


async def login_form(request: web.Request) -> web.StreamResponse:
    nonce = secrets.token_urlsafe(24)
    expired = request.query.get("expired") == "1"
    response = render(request, "login.html", csrf=nonce, expired=expired, error="", **login_choices(request))
    response.set_cookie(LOGIN_COOKIE, nonce, max_age=600, path="/ui/", httponly=True, samesite="Strict")
    return secure(response)


def login_csrf(request: web.Request, presented: object) -> str | web.StreamResponse:
    """A login form's CSRF token when it is the login cookie's (no session exists yet), or the refusal."""
    expected = request.cookies.get(LOGIN_COOKIE)
    if isinstance(presented, str) and expected and secrets.compare_digest(presented, expected):
        return presented
    message = "the login form carries no valid CSRF token (open /ui/login again)"
    return secure(render(request, "error.html", 403, title="Refused", message=message))


async def login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    presented = login_csrf(request, form.get("csrf"))
    if isinstance(presented, web.StreamResponse):
        return presented
    token = form.get("token")
    token = token.strip() if isinstance(token, str) else ""
    session = await _open_session(request, token)
    if session is None:
        response = render(
            request,
            "login.html",
            401,
            csrf=presented,
            expired=False,
            error=("not an admin token nor an active project key"),
            **login_choices(request),
        )
        return secure(response)
    response = web.HTTPSeeOther("/ui/" if session.kind == "admin" else "/ui/tenants")
    set_session_cookie(response, session, request)
    response.del_cookie(LOGIN_COOKIE, path="/ui/")
    raise response


def login_choices(request: web.Request) -> dict[str, Any]:
    """What the login page offers people besides the token form: the Cluster's identity provider (its issuer),
    or, where none is configured, a password."""
    d = controller(request).desired
    provider = d.cluster.console.identity_provider if d is not None else None
    return {
        "provider": provider.issuer if provider is not None else None,
        "notice": request.query.get("done", ""),
    }


async def _open_session(request: web.Request, token: str) -> Session | None:
    c, sessions = controller(request), request.app[CONSOLE].sessions
    if not token:
        return None
    principal = c.admin_tokens.principal(token)
    if principal is not None:
        await c.event("console_login", principal.name, f"console session (scope {principal.scope})")
        return sessions.open_admin(principal)
    try:
        found = await keymod.lookup(c.store, token, c.wall())
    except StoreError:
        return None
    # A personal key is not a project's console login: a person signs in as themselves (docs/console.md).
    if found is None or found.state != "active" or found.owner is not None or found.project is None:
        return None
    return sessions.open_tenant(found.key_id, found.project, token)


async def login_once(request: web.Request) -> web.StreamResponse:
    session = request.app[CONSOLE].sessions.redeem(request.match_info["nonce"])
    if session is None:
        return secure(
            render(
                request,
                "error.html",
                403,
                title="Link used or expired",
                message=(
                    "a one-time login link opens one session, once, within 10 minutes; log in with the admin token"
                ),
            )
        )
    response = web.HTTPSeeOther("/ui/")
    set_session_cookie(response, session, request)
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    request.app[CONSOLE].sessions.close(request.cookies.get(COOKIE))
    response = web.HTTPSeeOther("/ui/login")
    response.del_cookie(COOKIE, path="/ui/")
    raise response


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    body = request.app[CONSOLE].static.get(name)
    kind = STATIC_TYPES.get("." + name.rpartition(".")[2])
    if body is None or kind is None:
        return secure(web.Response(text="no such file", status=404))
    response = web.Response(body=body, content_type=kind)
    secure(response)
    response.headers["Cache-Control"] = "public, max-age=3600"
    return response


def json_block(value: Any) -> str:
    """JSON for a `<script type="application/json">` block (data, never run): `<` escaped, so no value can
    close the element."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
