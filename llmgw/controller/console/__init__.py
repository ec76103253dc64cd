"""The web console under `/ui/` on the controller's admin listener: server-rendered pages over the admin API's
own view functions, htmx for the live regions, uPlot for the usage charts, every asset vendored (see
static/VENDORED.json). docs/console.md describes it."""

from __future__ import annotations

from aiohttp import web

from llmgw.controller.console import chat, oidc, pages, signin, threads, you
from llmgw.controller.console.web import (
    CONSOLE,
    CONSOLE_PARTS,
    Access,
    ConsoleParts,
    ConsoleState,
    Handler,
    guarded,
    login,
    login_form,
    login_once,
    logout,
    make_state,
    secure,
    static,
)

__all__ = ["CONSOLE", "PAGES", "ConsoleState", "add_routes"]

# Every page and the access it needs (llmgw.controller.console.web.Access).
PAGES: tuple[tuple[str, str, Handler, Access], ...] = (
    ("GET", "/ui/", pages.overview, "plan"),
    ("GET", "/ui/nodes", pages.nodes, "plan"),
    ("GET", "/ui/nodes/{node}", pages.node, "plan"),
    ("GET", "/ui/models", pages.models, "plan"),
    ("GET", "/ui/replicas/{replica_id}", pages.replica, "plan"),
    ("GET", "/ui/plan", pages.plan, "plan"),
    ("GET", "/ui/events", pages.events, "plan"),
    ("GET", "/ui/tenants", pages.tenants, "tenant"),
    ("POST", "/ui/keys/{key_id}/revoke", pages.revoke_key, "admin"),
    ("GET", "/ui/people", signin.people_page, "admin"),
    ("POST", "/ui/people/{person}/password-link", signin.issue_password_link, "admin"),
    ("GET", "/ui/chat", chat.page, "any"),
    ("POST", "/ui/chat/send", chat.send, "any"),
    ("GET", "/ui/chat/decision/{request_id}", chat.decision, "any"),
    ("GET", "/ui/chat/threads", threads.threads_page, "person"),
    ("POST", "/ui/chat/threads/{thread_id}/delete", threads.delete_thread, "person"),
    ("GET", "/ui/notes", threads.notes_page, "person"),
    ("GET", "/ui/me", you.page, "person"),
    ("POST", "/ui/notes", threads.save_note, "person"),
    ("POST", "/ui/notes/{note_id}/delete", threads.delete_note, "person"),
    ("POST", "/ui/logout", logout, "any"),
)


async def _home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/ui/")


def add_routes(app: web.Application, parts: ConsoleParts) -> None:
    app[CONSOLE_PARTS] = parts
    app[CONSOLE] = make_state(parts)
    app.router.add_get("/ui", _home)
    app.router.add_get("/ui/login", login_form)
    app.router.add_post("/ui/login", _plain(login))
    app.router.add_get("/ui/login/once/{nonce}", login_once)
    app.router.add_post("/ui/login/person", _plain(signin.password_login))
    app.router.add_get("/ui/password/{nonce}", _plain(signin.password_form))
    app.router.add_post("/ui/password/{nonce}", _plain(signin.password_set))
    app.router.add_get("/ui/login/oidc", _plain(oidc.start))
    app.router.add_get("/ui/login/oidc/callback", _plain(oidc.callback))
    app[oidc.OIDC] = oidc.OidcClient()
    app[CONSOLE].checks.extend([signin.person_stays, oidc.recheck])
    app.router.add_get("/ui/static/{name}", static)
    for method, path, handler, access in PAGES:
        app.router.add_route(method, path, guarded(access, handler))


def _plain(handler: Handler) -> Handler:
    async def headed(request: web.Request) -> web.StreamResponse:
        return secure(await handler(request))

    return headed
