"""API keys: `Authorization: Bearer KEY` -> the key's project, through a small cache in front of a key store.

The store holds only sha256 hashes; the router hashes what it is sent and looks that up. A token that cannot
be a key (`llmgw.adapters.keys.looks_like_key`: not `sk-llmgw-` and 40+ characters) is refused without a lookup, so a
flood of random tokens costs the store nothing. Answers (including "no such key") are cached in memory for a
short time so the hot path touches the store once per key per TTL, and revocation takes effect within the TTL.
A key in use is looked up again in the last fifth of its TTL, in the background, while its cached answer (still
within the TTL) serves: under steady traffic no request waits for the store. One lookup per key at a time: the
requests that need the same key meanwhile wait for that one answer (an entry that expired under load sent one
lookup per request in flight, one after another: 400 ms on a busy SQLite store). The cache is bounded and
evicts the least recently used entry, so a flood of well-shaped random keys pushes out only colder entries,
never every tenant's key at once. Keys and Authorization headers never reach logs.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from llmgw.core.security import bearer_token
from llmgw.core.snapshot import Tenants
from llmgw.core.tenancy.keys import hash_key, looks_like_key
from llmgw.core.tenancy.people import may, project_role
from llmgw.store.errors import StoreError
from llmgw.store.records import KeyLookup
from llmgw_router.server.errors import ApiError
from llmgw_router.server.exchange import Exchange

__all__ = [
    "PROJECT_HEADER",
    "Authenticator",
    "KeyPrincipal",
    "KeyStore",
    "StaticKeys",
    "StoreKeys",
    "auth_disabled_principal",
    "is_operator",
    "personal_principal",
]

# A personal key's request names the project it is for here (else the key's default project is used).
PROJECT_HEADER = "x-llmgw-project"

log = logging.getLogger(__name__)


class KeyStore(Protocol):
    """Where key hashes are looked up. A store that answers any token cheaply (an in-memory file) sets a class
    attribute `any_token = True`; for every other store a token without our key shape is refused unasked."""

    async def lookup_key(self, key_hash: str) -> KeyLookup | None: ...


# Not frozen: built on every request, and a frozen dataclass costs about three times as much to construct
# (object.__setattr__ per field). Nothing mutates these after construction.
@dataclass(slots=True)
class KeyPrincipal:
    key_id: str | None
    project: str | None  # None only when auth is disabled (or, until `personal_principal`, a personal key's)
    person: str | None = None  # a personal key's owner: charged with the project, held to their limits


def auth_disabled_principal() -> KeyPrincipal:
    return KeyPrincipal(None, None)


class StoreKeys:
    """Key lookups through the store (hashes only)."""

    def __init__(self, store: Any, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    async def lookup_key(self, key_hash: str) -> KeyLookup | None:
        found: KeyLookup | None = await self._store.lookup_key(key_hash, self._clock())
        return found


class StaticKeys:
    """Keys from a file of hashes, for a router with no store. One key per line: `SHA256HEX PROJECT [KEY_ID]`.

    The file may hold the hash of any token an operator chose (not only `sk-llmgw-` keys), and a lookup is a
    dict access, so tokens are not shape-checked against it."""

    any_token = True

    def __init__(self, entries: dict[str, KeyLookup]) -> None:
        self._entries = entries

    @classmethod
    def from_file(cls, path: str | Path) -> StaticKeys:
        return cls.from_file_lines(Path(path).read_text().splitlines(), str(path))

    @classmethod
    def from_file_lines(cls, lines: list[str], path: str = "keys") -> StaticKeys:
        entries: dict[str, KeyLookup] = {}
        for number, raw in enumerate(lines, start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            digest = parts[0].removeprefix("sha256:").lower()
            if (
                len(parts) not in (2, 3)
                or len(digest) != 64
                or any(c not in "0123456789abcdef" for c in digest)
            ):
                raise ValueError(
                    f"{path}:{number}: expected `SHA256HEX PROJECT [KEY_ID]` (64 hex digits), got {len(parts)} fields"
                )
            key_id = parts[2] if len(parts) == 3 else digest[:12]
            entries[digest] = KeyLookup(key_id=key_id, project=parts[1], state="active", expires_at=None)
        return cls(entries)

    async def lookup_key(self, key_hash: str) -> KeyLookup | None:
        return self._entries.get(key_hash)


def is_operator(header: str | None, token: str | None) -> bool:
    """Whether an Authorization header carries the router's operator token (`--operator-token-file`), in
    constant time; never when the router has none."""
    sent = bearer_token(header)
    return token is not None and sent is not None and hmac.compare_digest(sent.encode(), token.encode())


class Authenticator:
    """Answers who is calling. With `store=None` authentication is disabled and every request is anonymous."""

    def __init__(
        self,
        store: KeyStore | None,
        clock: Callable[[], float] = time.time,
        ttl: float = 10.0,
        negative_ttl: float = 2.0,
        max_entries: int = 100_000,
    ) -> None:
        self._store = store
        self._clock = clock
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._max_entries = max_entries
        self._cache: OrderedDict[str, tuple[float, KeyLookup | None]] = OrderedDict()  # least recent first
        self._refresh_within = ttl / 5  # a key in use is looked up again this long before its entry expires
        self._lookups: dict[str, asyncio.Task[KeyLookup | None]] = {}  # by digest: the one under way
        # Only our own key shape is worth a store query; an in-memory keys file answers any token for free.
        self._shape_checked = not getattr(store, "any_token", False)
        self._store_error: str | None = None  # set while the key store is unreachable
        # The snapshot's tenants, read at each personal key's request (the request service sets it): whom a
        # person's key may serve is decided there, never cached with the key.
        self.tenants: Callable[[], Tenants] = Tenants

    @property
    def enabled(self) -> bool:
        return self._store is not None

    async def caller(self, exchange: Exchange) -> KeyPrincipal:
        """Who sent this request (401 ApiError when no valid key); once known, its connection no longer
        counts as anonymous against the listener's caps (listener.py, H6)."""
        principal = await self.authenticate(exchange.headers.get("authorization"))
        exchange.authenticated()
        if principal.person is not None:  # a person's own key: the project it names, if they belong there
            return personal_principal(principal, self.tenants(), exchange.headers.get(PROJECT_HEADER))
        return principal

    async def authenticate(self, header: str | None) -> KeyPrincipal:
        if self._store is None:
            return auth_disabled_principal()
        if not header:
            raise ApiError(
                401,
                "Missing API key: send it as `Authorization: Bearer YOUR_KEY`.",
                "missing_api_key",
            )
        token = bearer_token(header)
        if token is None:
            raise ApiError(
                401,
                "Malformed Authorization header: expected `Authorization: Bearer YOUR_KEY`.",
                "invalid_api_key",
            )
        if self._shape_checked and not looks_like_key(token):
            return _principal(None, token, 0.0)  # raises 401: no key has this shape, so no lookup
        digest = hash_key(token)
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None:
            self._cache.move_to_end(digest)
        if cached is not None and cached[0] > now:
            found = cached[1]
            if found is not None and cached[0] - now < self._refresh_within and digest not in self._lookups:
                self._start_lookup(digest)  # not awaited: this request is served by the answer still valid
        else:
            try:
                found = await asyncio.shield(self._lookups.get(digest) or self._start_lookup(digest))
            except StoreError as exc:
                return self._store_down(digest, token, now, cached, exc)
        return _principal(found, token, now)

    def _start_lookup(self, digest: str) -> asyncio.Task[KeyLookup | None]:
        task = self._lookups[digest] = asyncio.create_task(self._lookup(digest))
        task.add_done_callback(functools.partial(self._lookup_done, digest))
        return task

    def _lookup_done(self, digest: str, task: asyncio.Task[KeyLookup | None]) -> None:
        del self._lookups[digest]
        # A background lookup's failure was for no request: the entry serves until it expires, and the first
        # request after that meets the store itself (and says whether it is down).
        if not task.cancelled():
            task.exception()

    async def _lookup(self, digest: str) -> KeyLookup | None:
        assert self._store is not None, "authenticate looks keys up only with a store"
        # The answer holds from the moment it was asked for: a revocation meanwhile is not missed.
        asked = self._clock()
        found = await self._store.lookup_key(digest)
        if self._store_error is not None:
            log.warning("key store reachable again")
            self._store_error = None
        self._cache[digest] = (asked + (self._ttl if found else self._negative_ttl), found)
        self._cache.move_to_end(digest)
        while len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)  # bounded memory: the least recently used key goes first
        return found

    def _store_down(
        self,
        digest: str,
        token: str,
        now: float,
        cached: tuple[float, KeyLookup | None] | None,
        exc: Exception,
    ) -> KeyPrincipal:
        """The store is unreachable: a key answered before keeps its last answer (an outage must not turn
        every request into an error; a key revoked meanwhile is refused once the store is back). A key never
        seen is a 503 the client may retry, never a 500."""
        if self._store_error is None:
            log.warning("key store unreachable, serving keys from the last answers: %s", exc)
        self._store_error = str(exc)
        if cached is not None and cached[1] is not None:
            return _principal(cached[1], token, now)
        raise ApiError(
            503,
            "The key store is unreachable right now, so this key cannot be checked; retry shortly.",
            "key_store_unavailable",
            "server_error",
            headers={"Retry-After": "5"},
        )


def _principal(found: KeyLookup | None, token: str, now: float) -> KeyPrincipal:
    shown = token[:8] + "..." if len(token) > 12 else "(short key)"
    if found is None:
        raise ApiError(401, f"Incorrect API key provided: {shown} is not a known key.", "invalid_api_key")
    if found.state == "revoked":
        raise ApiError(401, f"API key {shown} (id {found.key_id}) has been revoked.", "key_revoked")
    if found.state == "expired" or (found.expires_at is not None and found.expires_at <= now):
        raise ApiError(401, f"API key {shown} (id {found.key_id}) has expired.", "key_expired")
    return KeyPrincipal(found.key_id, found.project, found.owner)


def personal_principal(principal: KeyPrincipal, tenants: Tenants, named: str | None) -> KeyPrincipal:
    """A personal key's request, for the project it names (`x-llmgw-project`, else the key's default): allowed
    only while the snapshot's people say its owner may use models there, so a person removed from a project
    by a commit is refused on the first request after the snapshot that says so (the key cache holds the
    key's owner, never a membership). 400 when no project is named, 403 when the person may not use it."""
    person = principal.person
    assert person is not None, "a personal key's principal"
    if person not in tenants.people:
        raise ApiError(
            403,
            f"API key {principal.key_id} belongs to person `{person}`, who is not in the cluster repo.",
            "person_not_declared",
            "permission_error",
        )
    project = named or principal.project
    if not project:
        raise ApiError(
            400,
            f"API key {principal.key_id} is person `{person}`'s own with no default project: name the project "
            f"with the `{PROJECT_HEADER}` header.",
            "project_required",
        )
    if project not in tenants.projects:
        raise ApiError(
            403, f"Project `{project}` is not in the cluster repo.", "unknown_project", "permission_error"
        )
    role = project_role(person, project, tenants)
    if not may(role, "use_models"):
        held = f"is a {role} there, who may not use models" if role else "is not a member"
        raise ApiError(
            403, f"Person `{person}` {held} of project `{project}`.", "not_a_member", "permission_error"
        )
    return KeyPrincipal(principal.key_id, project, person)
