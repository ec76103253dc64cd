"""People signing in to the console as themselves (issue 44), besides the admin token and project keys.

Who a person is and where they belong is the repo's (a `Person` document: llmgw.core.tenancy.people); how they
prove it is not. Where the Cluster configures no identity provider, with a password: an admin issues a one-time
link for a declared person (the People page), the person sets their password through it (scrypt:
llmgw.controller.console.passwords), and signs in with their name and it; a new password ends their sessions.
With a provider configured, passwords are not accepted: llmgw.controller.console.oidc.

A person's session lasts only while the repo declares them: every request asks again (`person_stays`), so a person
removed by a commit is signed out at their next request.
"""

from __future__ import annotations

import asyncio
import functools

from aiohttp import web

from llmgw.controller.console.passwords import (
    FAILURE_WINDOW_S,
    PasswordError,
    hash_password,
    held_back,
    password_problem,
    verify_password,
)
from llmgw.controller.console.sessions import PersonSignIn, Session
from llmgw.controller.console.web import (
    CONSOLE,
    controller,
    login_choices,
    login_csrf,
    render,
    secure,
    session_of,
    set_session_cookie,
)
from llmgw.core.config.specs.console_spec import IdentityProvider
from llmgw.store import StoreError

__all__ = [
    "declared_people",
    "identity_provider",
    "issue_password_link",
    "password_form",
    "password_login",
    "password_set",
    "people_page",
    "person_stays",
]


def declared_people(request: web.Request) -> dict[str, str]:
    """Person name -> email, as the applied revision declares them ({} before one is applied)."""
    d = controller(request).desired
    if d is None:
        return {}
    return {name: spec.email for name, spec in d.catalog.tenants().people.items()}


def identity_provider(request: web.Request) -> IdentityProvider | None:
    d = controller(request).desired
    return d.cluster.console.identity_provider if d is not None else None


async def person_stays(request: web.Request, session: Session) -> bool:
    """Whether a person's session goes on: the applied revision still declares them. (Their groups, through a
    provider, are asked again by llmgw.controller.console.oidc.)"""
    return session.kind != "person" or session.name in declared_people(request)


def _refused(request: web.Request, code: int, title: str, message: str) -> web.StreamResponse:
    return secure(render(request, "error.html", code, title=title, message=message))


# ------------------------------------------------------------------------------------------------ admins


async def people_page(request: web.Request) -> web.StreamResponse:
    c = controller(request)
    people = declared_people(request)
    try:
        with_password = {name for name in people if await c.store.password_of(name) is not None}
    except StoreError as exc:
        return _refused(request, 503, "Unavailable", f"the store is unavailable: {exc}")
    return render(
        request,
        "people.html",
        people=sorted(people.items()),
        with_password=with_password,
        provider=identity_provider(request),
        link=None,
        link_for=None,
    )


async def issue_password_link(request: web.Request) -> web.StreamResponse:
    """A one-time link for a declared person to set their password (shown once, to the admin who asked)."""
    person = request.match_info["person"]
    people = declared_people(request)
    if person not in people:
        known = ", ".join(sorted(people)) or "none"
        return _refused(
            request, 404, "Not found", f"no person {person!r} is declared in the repo (people: {known})"
        )
    if identity_provider(request) is not None:
        message = "this cluster signs people in with its identity provider: passwords are not used"
        return _refused(request, 409, "Not used", message)
    c = controller(request)
    nonce = request.app[CONSOLE].sessions.password_link(person)
    await c.event("console_password_link", person, f"a password link issued by {session_of(request).name}")
    link = f"{request.scheme}://{request.host}/ui/password/{nonce}"
    return render(
        request,
        "people.html",
        people=sorted(people.items()),
        with_password=set(),
        provider=None,
        link=link,
        link_for=person,
    )


# ------------------------------------------------------------------------------------------------ people


async def password_form(request: web.Request) -> web.StreamResponse:
    person = request.app[CONSOLE].sessions.password_link_person(request.match_info["nonce"], take=False)
    if person is None:
        return _gone(request)
    return secure(render(request, "password.html", person=person, error=""))


def _gone(request: web.Request) -> web.StreamResponse:
    message = "a password link sets one password, once, within a day: ask an admin for a new one"
    return _refused(request, 403, "Link used or expired", message)


async def password_set(request: web.Request) -> web.StreamResponse:
    sessions = request.app[CONSOLE].sessions
    nonce = request.match_info["nonce"]
    person = sessions.password_link_person(nonce, take=False)
    if person is None or person not in declared_people(request):
        return _gone(request)
    form = await request.post()
    password, again = form.get("password"), form.get("again")
    problem = (
        password_problem(password, again)
        if isinstance(password, str) and isinstance(again, str)
        else "type the new password twice"
    )
    if problem is not None or not isinstance(password, str):
        return secure(render(request, "password.html", 400, person=person, error=problem))
    if sessions.password_link_person(nonce, take=True) is None:  # used meanwhile (a double submit)
        return _gone(request)
    c = controller(request)
    encoded = await asyncio.to_thread(hash_password, password)
    await c.store.set_password(person, encoded, c.wall())
    ended = sessions.close_person(person)
    await c.event(
        "console_password_set", person, f"password set through a one-time link ({ended} sessions ended)"
    )
    raise web.HTTPSeeOther("/ui/login?done=password")


async def password_login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    presented = login_csrf(request, form.get("csrf"))
    if isinstance(presented, web.StreamResponse):
        return presented
    name, password = form.get("person"), form.get("password")
    name = name.strip() if isinstance(name, str) else ""
    password = password if isinstance(password, str) else ""
    c, sessions = controller(request), request.app[CONSOLE].sessions

    def again(code: int, error: str) -> web.StreamResponse:
        page = render(
            request, "login.html", code, csrf=presented, expired=False, error=error, **login_choices(request)
        )
        return secure(page)

    if identity_provider(request) is not None:
        return again(409, "this cluster signs people in with its identity provider: use its button")
    now = c.wall()
    wait = held_back(sessions.failures.get(name, []), now)
    if wait is not None:
        return again(429, f"too many failed sign-ins for {name}: try again in {wait:.0f}s")
    try:
        encoded = await c.store.password_of(name) if name in declared_people(request) else None
    except StoreError as exc:
        return again(503, f"the store is unavailable: {exc}")
    try:
        # Hashed even for an unknown name (against a throwaway hash): the answer's time does not tell who exists.
        ok = await asyncio.to_thread(verify_password, password, encoded or _decoy()) and encoded is not None
    except PasswordError as exc:
        return again(401, str(exc))
    if not ok:
        if name in declared_people(request):  # only theirs: a flood of made-up names grows nothing
            sessions.failures[name] = [
                t for t in sessions.failures.get(name, []) if now - t < FAILURE_WINDOW_S
            ]
            sessions.failures[name].append(now)
        return again(401, "no such person with that password (or they have set none: an admin issues a link)")
    sessions.failures.pop(name, None)
    session = sessions.open_person(name, PersonSignIn(via="password"))
    await c.event("console_login", name, "console session (person, password)")
    response = web.HTTPSeeOther("/ui/chat")
    set_session_cookie(response, session, request)
    raise response


@functools.cache
def _decoy() -> str:
    return hash_password("not anyone's password", salt=b"\0" * 16)
