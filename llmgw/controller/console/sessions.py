"""Console sessions: who is logged in, until when, and the CSRF token their forms carry.

A session is made by presenting an admin token (the admin API's principals, with their scope), a project's
API key (a tenant: their project only), or by a person signing in as themselves (a password, or the Cluster's
OpenID Connect provider: llmgw.controller.console.signin). The browser holds only a random session id in an HttpOnly,
SameSite=Strict cookie; the token or key stays on the server, in this process's memory: a restart logs
everyone out, which is the safe way round. One-time login links (`llmgw up` prints one) are single-use and
short-lived.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from llmgw.controller.parts.admin_tokens import AdminPrincipal, Scope, allows

Kind = Literal["admin", "tenant", "person"]
Via = Literal["password", "oidc"]
COOKIE = "llmgw_console"
LOGIN_COOKIE = "llmgw_console_login"  # the login form's CSRF double-submit (no session exists yet)
ONE_TIME_LINK_S = 600.0
PASSWORD_LINK_S = 24 * 3600.0  # a link an admin sends a person by mail: a day to open it
KEY_RECHECK_S = 30.0  # a tenant session ends within this long of its key being revoked or expiring
MAX_SESSIONS = 10_000  # a login loop must not grow this process without bound
# One admin token or one project key holds at most this many sessions: its own soonest-expiring one goes first,
# so a login loop with one key pushes out only that key's sessions, never an admin's (L13).
MAX_SESSIONS_PER_PRINCIPAL = 20
# A person holds fewer: a browser or two each; a new sign-in beyond them ends their oldest session.
MAX_SESSIONS_PER_PERSON = 5


@dataclass
class Session:
    id: str
    kind: Kind
    name: str  # the admin token's name, or the key's id: what the audit trail records
    scope: Scope | None  # an admin token's scope; None for a tenant
    project: str | None  # a tenant's project; None for an admin
    csrf: str
    expires_at: float
    key: str | None = field(default=None, repr=False)  # a tenant's key, for the chat page (never sent back)
    key_checked_at: float = 0.0  # when a tenant's key was last found active in the store
    person: PersonSignIn | None = None  # a person's: how they signed in, what the provider said of them

    def may(self, need: Scope) -> bool:
        return self.scope is not None and allows(self.scope, need)

    @property
    def who(self) -> str:
        if self.kind == "person":
            return f"{self.name} (person)"
        return f"{self.name} ({self.scope})" if self.kind == "admin" else f"project {self.project}"


@dataclass
class PersonSignIn:
    """What a person's session knows besides their name: how they signed in and, through a provider, the
    groups it last said they are in (asked again every `recheck_s`, with the access token it gave)."""

    via: Via
    groups: tuple[str, ...] = ()
    groups_checked_at: float = 0.0
    access_token: str | None = field(default=None, repr=False)


@dataclass
class Sessions:
    """In memory, by id. `wall` is the controller's clock (a test moves it to expire a session)."""

    wall: Callable[[], float]
    ttl_s: float
    by_id: dict[str, Session] = field(default_factory=dict)
    links: dict[str, tuple[AdminPrincipal, float]] = field(default_factory=dict)
    password_links: dict[str, tuple[str, float]] = field(default_factory=dict)  # nonce -> (person, until)
    failures: dict[str, list[float]] = field(default_factory=dict)  # person -> failed sign-ins' times

    def open_admin(self, principal: AdminPrincipal) -> Session:
        return self._open("admin", principal.name, principal.scope, None, None)

    def open_tenant(self, key_id: str, project: str, key: str) -> Session:
        return self._open("tenant", key_id, None, project, key)

    def open_person(self, name: str, signed_in: PersonSignIn) -> Session:
        session = self._open("person", name, None, None, None)
        session.person = signed_in
        return session

    def close_person(self, name: str) -> int:
        """End every session of the person (their password was reset, or they left): how many ended."""
        ids = [sid for sid, s in self.by_id.items() if (s.kind, s.name) == ("person", name)]
        for sid in ids:
            del self.by_id[sid]
        return len(ids)

    def _open(
        self, kind: Kind, name: str, scope: Scope | None, project: str | None, key: str | None
    ) -> Session:
        self._prune()
        for sid in evictions(list(self.by_id.values()), kind, name):
            del self.by_id[sid]
        session = Session(
            id=secrets.token_urlsafe(32),
            kind=kind,
            name=name,
            scope=scope,
            project=project,
            csrf=secrets.token_urlsafe(32),
            expires_at=self.wall() + self.ttl_s,
            key=key,
            key_checked_at=self.wall(),
        )
        self.by_id[session.id] = session
        return session

    def get(self, session_id: str | None) -> tuple[Session | None, bool]:
        """The live session of `session_id`, and whether one existed but expired (then it is gone)."""
        if not session_id:
            return None, False
        session = self.by_id.get(session_id)
        if session is None:
            return None, False
        if session.expires_at <= self.wall():
            del self.by_id[session_id]
            return None, True
        return session, False

    def close(self, session_id: str | None) -> None:
        if session_id:
            self.by_id.pop(session_id, None)

    def one_time_link(self, principal: AdminPrincipal) -> str:
        """A nonce that opens one session for `principal`, once, within ONE_TIME_LINK_S."""
        nonce = secrets.token_urlsafe(32)
        self.links[nonce] = (principal, self.wall() + ONE_TIME_LINK_S)
        return nonce

    def redeem(self, nonce: str) -> Session | None:
        entry = self.links.pop(nonce, None)
        if entry is None or entry[1] <= self.wall():
            return None
        return self.open_admin(entry[0])

    def password_link(self, person: str) -> str:
        """A nonce that lets `person` set their password, once, within PASSWORD_LINK_S; an earlier one of
        theirs stops working (the admin issued a new one because the old went astray)."""
        self._prune()
        for nonce in [k for k, (who, _) in self.password_links.items() if who == person]:
            del self.password_links[nonce]
        nonce = secrets.token_urlsafe(32)
        self.password_links[nonce] = (person, self.wall() + PASSWORD_LINK_S)
        return nonce

    def password_link_person(self, nonce: str, take: bool) -> str | None:
        """Whose password link `nonce` is (None: unknown, used or expired); `take` uses it up."""
        entry = self.password_links.pop(nonce, None) if take else self.password_links.get(nonce)
        if entry is None or entry[1] <= self.wall():
            return None
        return entry[0]

    def _prune(self) -> None:
        now = self.wall()
        for sid in [k for k, s in self.by_id.items() if s.expires_at <= now]:
            del self.by_id[sid]
        for nonce in [k for k, (_, until) in self.links.items() if until <= now]:
            del self.links[nonce]
        for nonce in [k for k, (_, until) in self.password_links.items() if until <= now]:
            del self.password_links[nonce]


def evictions(sessions: list[Session], kind: Kind, name: str) -> list[str]:
    """The sessions to close before (`kind`, `name`) opens one more: its own soonest-expiring ones down to
    MAX_SESSIONS_PER_PRINCIPAL - 1 (a person's: MAX_SESSIONS_PER_PERSON - 1); then, at MAX_SESSIONS, one of the
    principal holding the most tenant or person sessions (an admin's only when none holds any). Pure: the caller
    deletes them."""
    mine = sorted((s for s in sessions if (s.kind, s.name) == (kind, name)), key=lambda s: s.expires_at)
    cap = MAX_SESSIONS_PER_PERSON if kind == "person" else MAX_SESSIONS_PER_PRINCIPAL
    out = [s.id for s in mine[: max(0, len(mine) - cap + 1)]]
    if len(sessions) - len(out) < MAX_SESSIONS:
        return out
    left = [s for s in sessions if s.id not in set(out)]
    tenants = [s for s in left if s.kind != "admin"]
    pool = tenants or left
    counts: dict[tuple[Kind, str], int] = {}
    for s in pool:
        counts[(s.kind, s.name)] = counts.get((s.kind, s.name), 0) + 1
    hog = max(counts, key=lambda n: counts[n])
    out.append(min((s for s in pool if (s.kind, s.name) == hog), key=lambda s: s.expires_at).id)
    return out


def tenant_session_stays(session: Session, now: float, active: bool | None, store_grace_s: float) -> bool:
    """Whether a tenant's session stays open after its key was looked up again: `active` is the store's answer
    (None: the store could not be asked). Without an answer it stays only `store_grace_s` past the last time the
    key was found active, then fails closed: a key revoked during an outage must not keep its session open."""
    if active is None:
        return now - session.key_checked_at < KEY_RECHECK_S + store_grace_s
    return active


CookieSecure = Literal["auto", "always", "never"]


def cookie_secure(mode: CookieSecure, over_tls: bool, listens_on_loopback: bool) -> bool:
    """Whether the session cookie is `Secure`. `auto`: when the request came over TLS, or when the controller
    listens beyond loopback over plain HTTP (then TLS ends at a proxy in front, which `request.secure` cannot
    see; a network listener with no TLS at all is what `never` is for, and says so in the settings)."""
    if mode != "auto":
        return mode == "always"
    return over_tls or not listens_on_loopback


def csrf_ok(session: Session, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), session.csrf.encode())
