"""People signing in to the console through the Cluster's OpenID Connect provider (issue 44): the authorization
code flow with PKCE (S256), `state` and `nonce` checked, the ID token verified against the provider's JWKS
(llmgw.controller.console.oidc_checks), the person found by the email the provider vouches for.

The flow: `/ui/login/oidc` makes a state, a nonce and a PKCE verifier, keeps them here (in memory, ten minutes,
bound to this browser by a SameSite=Lax cookie: the provider's redirect back is a cross-site navigation, which a
Strict cookie would not come with) and sends the browser to the provider. `/ui/login/oidc/callback` takes the
state once, exchanges the code with the verifier and the client secret (a secret reference, bound to the token
endpoint's host), checks the ID token, asks the userinfo endpoint for the person's current claims, and opens a
person session. Its answer is a page that moves on by itself: a Strict session cookie is not sent on a redirect
chain that began at another site.

The provider's groups are asked again (userinfo, with the access token it gave) when a session is used after the
Cluster's `recheck`; a token the provider no longer honours ends the session, a provider that cannot be reached
leaves the session without the groups' grants until it answers. docs/tenancy.md, Signing in.
"""

from __future__ import annotations

import base64
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from llmgw.controller.console.oidc_checks import (
    Discovery,
    SignInError,
    authorization_url,
    check_id_token,
    discovery_from,
    groups_in,
    key_id,
    person_for,
    pkce_pair,
)
from llmgw.controller.console.sessions import PersonSignIn, Session
from llmgw.controller.console.signin import declared_people, identity_provider
from llmgw.controller.console.web import (
    CONSOLE,
    controller,
    cookie_is_secure,
    render,
    secure,
    set_session_cookie,
)
from llmgw.core.config.secret_bindings import SecretUse
from llmgw.core.config.secretrefs import SecretRefError, resolve_bound
from llmgw.core.config.specs.console_spec import IdentityProvider
from llmgw.core.words import parse_duration

__all__ = ["OIDC", "OidcClient", "callback", "recheck", "start"]

FLOW_COOKIE = "llmgw_console_oidc"
FLOW_PATH = "/ui/login/oidc"
FLOW_S = 600.0
MAX_PENDING = (
    1000  # sign-ins begun and not finished: a loop of starts must not grow this process without bound
)
HTTP_S = 10.0
CACHE_S = 300.0  # the discovery document and the JWKS are fetched again after this (and on an unknown kid)


@dataclass
class Pending:
    browser: str  # the flow cookie's value: the callback must come from the browser that began
    nonce: str
    verifier: str
    redirect_uri: str
    until: float


@dataclass
class OidcClient:
    """Sign-ins in progress and what was fetched from providers, for one console."""

    pending: dict[str, Pending] = field(default_factory=dict)  # by state
    discovered: dict[str, tuple[Discovery, float]] = field(default_factory=dict)  # by issuer
    key_sets: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)  # by jwks_uri

    def begin(self, pending: Pending, now: float) -> str:
        for state in [s for s, p in self.pending.items() if p.until <= now]:
            del self.pending[state]
        if len(self.pending) >= MAX_PENDING:
            del self.pending[min(self.pending, key=lambda s: self.pending[s].until)]
        state = secrets.token_urlsafe(32)
        self.pending[state] = pending
        return state

    async def discovery(self, provider: IdentityProvider) -> Discovery:
        cached = self.discovered.get(provider.issuer)
        if cached is not None and time.monotonic() - cached[1] < CACHE_S:
            return cached[0]
        doc = await _get_json(provider.issuer.rstrip("/") + "/.well-known/openid-configuration", None)
        found = discovery_from(doc, provider.issuer)
        self.discovered[provider.issuer] = (found, time.monotonic())
        return found

    async def key_set(self, found: Discovery, kid: object) -> dict[str, Any]:
        """The provider's JWKS; fetched again when it is old or holds no key `kid` (the provider rotated)."""
        cached = self.key_sets.get(found.jwks_uri)
        fresh = cached is not None and time.monotonic() - cached[1] < CACHE_S
        if cached is not None and fresh and any(k.get("kid") == kid for k in cached[0].get("keys", [])):
            return cached[0]
        doc = await _get_json(found.jwks_uri, None)
        if not isinstance(doc, dict):
            raise SignInError(f"the provider's JWKS at {found.jwks_uri} is not a JSON object")
        self.key_sets[found.jwks_uri] = (doc, time.monotonic())
        return doc


OIDC: web.AppKey[OidcClient] = web.AppKey("console_oidc", OidcClient)


async def _get_json(url: str, bearer: str | None) -> Any:
    headers = {"Accept": "application/json"} | ({"Authorization": f"Bearer {bearer}"} if bearer else {})
    timeout = aiohttp.ClientTimeout(total=HTTP_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as client, client.get(url, headers=headers) as r:
            if r.status == 401:
                raise Unauthorized(f"{url} answered 401: the provider no longer honours the token")
            if r.status != 200:
                raise SignInError(f"{url} answered HTTP {r.status}")
            return await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise SignInError(f"{url} could not be read: {exc or type(exc).__name__}") from None


class Unauthorized(SignInError):
    """The provider refused the access token (expired, or revoked)."""


def _failed(request: web.Request, message: str, code: int = 401) -> web.StreamResponse:
    return secure(render(request, "error.html", code, title="Sign-in failed", message=message))


async def start(request: web.Request) -> web.StreamResponse:
    provider = identity_provider(request)
    if provider is None:
        return _failed(request, "no identity provider is configured: sign in with a password", 404)
    client = request.app[OIDC]
    try:
        found = await client.discovery(provider)
    except SignInError as exc:
        return _failed(request, f"the identity provider could not be asked: {exc}", 502)
    verifier, challenge = pkce_pair()
    browser, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    redirect_uri = f"{request.scheme}://{request.host}{FLOW_PATH}/callback"
    now = controller(request).wall()
    state = client.begin(Pending(browser, nonce, verifier, redirect_uri, now + FLOW_S), now)
    response = web.HTTPSeeOther(authorization_url(found, provider, redirect_uri, state, nonce, challenge))
    response.set_cookie(
        FLOW_COOKIE,
        browser,
        max_age=int(FLOW_S),
        path=FLOW_PATH,
        httponly=True,
        samesite="Lax",
        secure=cookie_is_secure(request),
    )
    raise response


async def callback(request: web.Request) -> web.StreamResponse:
    provider = identity_provider(request)
    if provider is None:
        return _failed(request, "no identity provider is configured: sign in with a password", 404)
    q = request.query
    pending = request.app[OIDC].pending.pop(q.get("state", ""), None)
    c = controller(request)
    if pending is None or pending.until <= c.wall():
        return _failed(
            request, "this sign-in is unknown or older than ten minutes: begin again at /ui/login", 400
        )
    browser = request.cookies.get(FLOW_COOKIE, "")
    if not secrets.compare_digest(browser.encode(), pending.browser.encode()):
        return _failed(request, "this sign-in was begun in another browser: begin again at /ui/login", 400)
    if "error" in q:
        return _failed(
            request, f"the provider refused: {q['error']} {q.get('error_description', '')}".strip()
        )
    try:
        person, signed_in = await _finish(request, provider, pending, q.get("code", ""))
    except (SignInError, SecretRefError) as exc:
        return _failed(request, str(exc))
    session = request.app[CONSOLE].sessions.open_person(person, signed_in)
    await c.event("console_login", person, f"console session (person, {provider.issuer})")
    page = render(request, "signed_in.html", person=person)
    set_session_cookie(page, session, request)
    page.del_cookie(FLOW_COOKIE, path=FLOW_PATH)
    return secure(page)


async def _finish(
    request: web.Request, provider: IdentityProvider, pending: Pending, code: str
) -> tuple[str, PersonSignIn]:
    if not code:
        raise SignInError("the provider sent no code back")
    client, c = request.app[OIDC], controller(request)
    found = await client.discovery(provider)
    tokens = await _exchange(request, provider, found, pending, code)
    id_token, access_token = tokens.get("id_token"), tokens.get("access_token")
    if not isinstance(id_token, str):
        raise SignInError("the provider's token answer has no id_token")
    keys = await client.key_set(found, key_id(id_token))
    claims = check_id_token(id_token, keys, found, provider, pending.nonce, c.wall())
    if isinstance(access_token, str) and found.userinfo_endpoint is not None:
        claims = claims | await _userinfo(found.userinfo_endpoint, access_token, claims["sub"])
    person = person_for(claims, declared_people(request))
    groups = groups_in(claims, provider.groups_claim)
    token = access_token if isinstance(access_token, str) else None
    return person, PersonSignIn(via="oidc", groups=groups, groups_checked_at=c.wall(), access_token=token)


async def _exchange(
    request: web.Request, provider: IdentityProvider, found: Discovery, pending: Pending, code: str
) -> dict[str, Any]:
    c = controller(request)
    use = SecretUse(provider.client_secret, "oidc-client-secret", found.token_endpoint)
    secret = resolve_bound(use, c.settings.secret_policy(), c.reserved_secret_names())
    # client_secret_basic: each part form-encoded first (RFC 6749, 2.3.1)
    pair = f"{quote(provider.client_id, safe='')}:{quote(secret, safe='')}"
    headers = {
        "Authorization": "Basic " + base64.b64encode(pair.encode()).decode("ascii"),
        "Accept": "application/json",
    }
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": pending.redirect_uri,
        "code_verifier": pending.verifier,
    }
    timeout = aiohttp.ClientTimeout(total=HTTP_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(found.token_endpoint, data=form, headers=headers) as r,
        ):
            body = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise SignInError(f"the token endpoint {found.token_endpoint} could not be read: {exc}") from None
    if r.status != 200 or not isinstance(body, dict):
        said = body.get("error_description") or body.get("error") if isinstance(body, dict) else None
        raise SignInError(
            f"the token endpoint refused the code (HTTP {r.status}): {said or 'no reason given'}"
        )
    return body


async def _userinfo(endpoint: str, access_token: str, subject: str) -> dict[str, Any]:
    info = await _get_json(endpoint, access_token)
    if not isinstance(info, dict) or info.get("sub") != subject:
        raise SignInError("the provider's userinfo is not about the account the ID token names (sub differs)")
    return info


async def recheck(request: web.Request, session: Session) -> bool:
    """A person session from the provider goes on only while the provider still honours its access token and
    still names the same person; their groups are refreshed when older than the Cluster's `recheck`."""
    signed_in = session.person
    if session.kind != "person" or signed_in is None or signed_in.via != "oidc":
        return True
    provider = identity_provider(request)
    if provider is None:
        return False  # the Cluster stopped signing people in through a provider: sign in again
    now = controller(request).wall()
    if now - signed_in.groups_checked_at < parse_duration(provider.recheck):
        return True
    if signed_in.access_token is None:
        return False
    try:
        found = await request.app[OIDC].discovery(provider)
        if found.userinfo_endpoint is None:
            return False
        claims = await _get_json(found.userinfo_endpoint, signed_in.access_token)
    except Unauthorized:
        return False
    except SignInError:
        # Not known now: no group grants until the provider answers again (fail closed, stay signed in).
        signed_in.groups = ()
        return True
    try:
        if not isinstance(claims, dict) or person_for(claims, declared_people(request)) != session.name:
            return False  # the provider now vouches for another address: not this person any more
    except SignInError:
        return False
    signed_in.groups = groups_in(claims, provider.groups_claim)
    signed_in.groups_checked_at = now
    return True
