"""The pure parts of the console's OpenID Connect sign-in (issue 44): PKCE, the authorization URL, the ID token's
checks, and who the token says signed in. No I/O: llmgw.controller.console.oidc fetches and calls these.

An ID token is accepted only when its signature verifies under a key of the provider's JWKS (by `kid`), with an
asymmetric algorithm the key is for (never `none`, never an HMAC: the client secret is no signing key here), and
its `iss` is the configured issuer, its `aud` holds the client id (and `azp` is it when there are several), it has
not expired, and its `nonce` is the one this sign-in sent.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import jwt

from llmgw.core.config.specs.console_spec import IdentityProvider
from llmgw.core.errors import LlmgwError

__all__ = [
    "SIGNING_ALGORITHMS",
    "Discovery",
    "SignInError",
    "authorization_url",
    "check_id_token",
    "discovery_from",
    "groups_in",
    "key_id",
    "person_for",
    "pkce_pair",
]

SIGNING_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"}
)
LEEWAY_S = 60  # clocks differ; a minute either way on exp and iat


class SignInError(LlmgwError):
    """A sign-in through the identity provider failed; the message says at which step and why (never a token)."""


@dataclass(frozen=True)
class Discovery:
    """What the provider's discovery document says this client needs."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    algorithms: frozenset[str]  # the ID token signing algorithms it offers that we accept


def discovery_from(doc: Any, issuer: str) -> Discovery:
    if not isinstance(doc, dict):
        raise SignInError(f"{issuer}/.well-known/openid-configuration is not a JSON object")
    if doc.get("issuer") != issuer:
        raise SignInError(
            f"the provider's discovery document names issuer {doc.get('issuer')!r}, not {issuer!r} as the "
            "Cluster's console.identity_provider.issuer does (they must be the same string)"
        )
    missing = [
        k for k in ("authorization_endpoint", "token_endpoint", "jwks_uri") if not isinstance(doc.get(k), str)
    ]
    if missing:
        raise SignInError(f"the provider's discovery document has no {', '.join(missing)}")
    offered = doc.get("id_token_signing_alg_values_supported")
    algorithms = SIGNING_ALGORITHMS & set(offered if isinstance(offered, list) else ["RS256"])
    if not algorithms:
        raise SignInError(
            f"the provider signs ID tokens only with {offered}; llmgw accepts {sorted(SIGNING_ALGORITHMS)}"
        )
    userinfo = doc.get("userinfo_endpoint")
    return Discovery(
        issuer,
        doc["authorization_endpoint"],
        doc["token_endpoint"],
        doc["jwks_uri"],
        userinfo if isinstance(userinfo, str) else None,
        frozenset(algorithms),
    )


def pkce_pair() -> tuple[str, str]:
    """(code_verifier, its S256 code_challenge): RFC 7636."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def authorization_url(
    found: Discovery, provider: IdentityProvider, redirect_uri: str, state: str, nonce: str, challenge: str
) -> str:
    scopes = ["openid", *(s for s in provider.scopes if s != "openid")]
    query = {
        "response_type": "code",
        "client_id": provider.client_id,
        "redirect_uri": redirect_uri,
        "scope": " ".join(scopes),
        "state": state,
        "nonce": nonce,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    joiner = "&" if "?" in found.authorization_endpoint else "?"
    return found.authorization_endpoint + joiner + urlencode(query)


def key_id(token: str) -> object:
    """The `kid` a JWT's header names (None when it names none or is no JWT: `check_id_token` says how)."""
    try:
        return jwt.get_unverified_header(token).get("kid")
    except jwt.PyJWTError:
        return None


def check_id_token(
    token: str, jwks: Mapping[str, Any], found: Discovery, provider: IdentityProvider, nonce: str, now: float
) -> dict[str, Any]:
    """The ID token's claims once every check holds (see the module's docstring); SignInError says which failed.
    `jwks`: the provider's JWK Set document."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise SignInError(f"the ID token is not a signed JWT: {exc}") from None
    algorithm = header.get("alg")
    if algorithm not in found.algorithms:
        raise SignInError(f"the ID token is signed with {algorithm!r}; accepted: {sorted(found.algorithms)}")
    key = _key_for(jwks, header.get("kid"), str(algorithm))
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[str(algorithm)],
            audience=provider.client_id,
            issuer=found.issuer,
            # Times are checked below against the controller's clock (`now`), not this process's.
            options={
                "require": ["iss", "sub", "aud", "exp", "iat"],
                "verify_exp": False,
                "verify_iat": False,
                "verify_nbf": False,
            },
        )
    except jwt.PyJWTError as exc:
        raise SignInError(f"the ID token was refused: {exc}") from None
    _check_times(claims, now)
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if len(audiences) > 1 and claims.get("azp") != provider.client_id:
        raise SignInError("the ID token is for several audiences and was not issued to this client (azp)")
    if not isinstance(claims.get("nonce"), str) or not secrets.compare_digest(claims["nonce"], nonce):
        raise SignInError("the ID token's nonce is not this sign-in's (a replayed or mixed-up token)")
    return claims


def _check_times(claims: Mapping[str, Any], now: float) -> None:
    try:
        expires, issued = float(claims["exp"]), float(claims["iat"])
        not_before = float(claims.get("nbf", issued))
    except (TypeError, ValueError):
        raise SignInError("the ID token's exp, iat or nbf is not a number") from None
    if expires <= now - LEEWAY_S:
        raise SignInError("the ID token has expired (exp): a stale or replayed token, or the clocks differ")
    if issued > now + LEEWAY_S or not_before > now + LEEWAY_S:
        raise SignInError("the ID token was issued in the future (iat, nbf): check the clocks")


def _key_for(jwks: Mapping[str, Any], kid: object, algorithm: str) -> Any:
    keys = jwks.get("keys")
    if not isinstance(keys, list):
        raise SignInError("the provider's JWKS has no `keys`")
    candidates = [k for k in keys if isinstance(k, dict) and k.get("use", "sig") == "sig"]
    if kid is not None:
        candidates = [k for k in candidates if k.get("kid") == kid]
    if len(candidates) != 1:
        raise SignInError(
            f"the provider's JWKS has {len(candidates)} signing keys for kid {kid!r}; need exactly one"
        )
    try:
        return jwt.PyJWK(candidates[0], algorithm).key
    except jwt.PyJWTError as exc:
        raise SignInError(f"the provider's key {kid!r} does not fit {algorithm}: {exc}") from None


def person_for(claims: Mapping[str, Any], people: Mapping[str, str]) -> str:
    """The declared person whose email the provider vouches for (`email`, with `email_verified` true); SignInError
    names what is missing or unknown. `people`: person name -> email, as the repo declares them."""
    email = claims.get("email")
    if not isinstance(email, str) or not email:
        raise SignInError("the provider gave no email for this account: ask for the `email` scope")
    if claims.get("email_verified") is not True:
        raise SignInError(f"the provider has not verified {email}: an unverified address names nobody")
    matches = [name for name, declared in people.items() if declared.lower() == email.lower()]
    if len(matches) != 1:
        what = "no Person" if not matches else f"{len(matches)} Persons ({', '.join(sorted(matches))})"
        raise SignInError(f"{what} in the repo has the email {email}: an admin declares people there")
    return matches[0]


def groups_in(claims: Mapping[str, Any], claim: str | None) -> tuple[str, ...]:
    """The groups the claim lists (none when no claim is configured or the provider gave none)."""
    if claim is None:
        return ()
    value = claims.get(claim)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(sorted({g for g in value if isinstance(g, str)}))
    return ()
