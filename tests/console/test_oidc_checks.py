"""The ID token checks of the console's OpenID Connect sign-in (issue 44), each refusal on its own: a token signed
by another key, with `none` or an HMAC, for another client or issuer, expired, or with another sign-in's nonce;
and who a token names. Pure: the browser test (test_oidc_browser.py) runs the whole flow against a real provider."""

from __future__ import annotations

import base64
import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from llmgw.controller.console.oidc_checks import (
    Discovery,
    SignInError,
    authorization_url,
    check_id_token,
    discovery_from,
    groups_in,
    person_for,
    pkce_pair,
)
from llmgw.core.config.specs.console_spec import IdentityProvider

ISSUER, CLIENT, NOW = "https://login.example.com", "llmgw-console", 1_700_000_000.0
PROVIDER = IdentityProvider.model_validate(
    {
        "issuer": ISSUER,
        "client_id": CLIENT,
        "client_secret": {"env": "LLMGW_SECRET_OIDC"},
        "groups_claim": "groups",
    }
)
FOUND = Discovery(
    ISSUER, ISSUER + "/auth", ISSUER + "/token", ISSUER + "/jwks", ISSUER + "/me", frozenset({"RS256"})
)
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _jwks(key: rsa.RSAPrivateKey = KEY, kid: str = "k1") -> dict[str, Any]:
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {"keys": [public | {"kid": kid, "use": "sig"}]}


def _token(key: Any = KEY, alg: str = "RS256", kid: str = "k1", **changes: Any) -> str:
    claims = {
        "iss": ISSUER,
        "sub": "u1",
        "aud": CLIENT,
        "iat": NOW,
        "exp": NOW + 300,
        "nonce": "n1",
    } | changes
    return jwt.encode(
        {k: v for k, v in claims.items() if v is not None}, key, algorithm=alg, headers={"kid": kid}
    )


def _unsigned() -> str:
    """An `alg: none` token, which PyJWT rightly will not make with a key."""
    header = base64.urlsafe_b64encode(b'{"alg":"none","kid":"k1"}').rstrip(b"=").decode()
    body = base64.urlsafe_b64encode(json.dumps({"iss": ISSUER, "aud": CLIENT}).encode()).rstrip(b"=").decode()
    return f"{header}.{body}."


def test_a_good_token_gives_its_claims() -> None:
    claims = check_id_token(_token(), _jwks(), FOUND, PROVIDER, "n1", NOW)
    assert (claims["sub"], claims["nonce"]) == ("u1", "n1")


@pytest.mark.parametrize(
    ("token", "said"),
    [
        (_token(key=OTHER_KEY), "Signature verification failed"),
        (_token(aud="someone-else"), "Audience doesn't match"),
        (_token(iss="https://evil.example.com"), "Invalid issuer"),
        (_token(exp=NOW - 3600), "has expired"),
        (_token(nonce="another sign-in's"), "nonce is not this sign-in's"),
        (_token(nonce=None), "nonce is not this sign-in's"),
        (_token(aud=[CLIENT, "other"]), "several audiences"),
        (_token(iat=NOW + 3600), "issued in the future"),
        (_token(kid="unknown"), "0 signing keys for kid 'unknown'"),
        (_token(key=b"the client secret as an HMAC key!", alg="HS256"), "signed with 'HS256'"),
        (_unsigned(), "signed with 'none'"),
        ("not.a.jwt", "not a signed JWT"),
    ],
)
def test_a_bad_token_is_refused_saying_why(token: str, said: str) -> None:
    with pytest.raises(SignInError, match=said):
        check_id_token(token, _jwks(), FOUND, PROVIDER, "n1", NOW)


def test_the_person_is_the_one_whose_verified_email_the_provider_vouches_for() -> None:
    people = {"ada": "Ada@Example.com", "bob": "bob@example.com"}
    assert person_for({"email": "ada@example.com", "email_verified": True}, people) == "ada"
    with pytest.raises(SignInError, match="has not verified"):
        person_for({"email": "ada@example.com", "email_verified": False}, people)
    with pytest.raises(SignInError, match=r"no Person in the repo has the email eve@example\.com"):
        person_for({"email": "eve@example.com", "email_verified": True}, people)
    with pytest.raises(SignInError, match="no email"):
        person_for({"sub": "u1"}, people)
    assert groups_in({"groups": ["b", "a", "b", 3]}, "groups") == ("a", "b")
    assert groups_in({"groups": "solo"}, "groups") == ("solo",)
    assert groups_in({"groups": ["a"]}, None) == ()


def test_the_authorization_url_asks_for_a_code_with_pkce_s256() -> None:
    verifier, challenge = pkce_pair()
    assert len(verifier) >= 43 and challenge != verifier
    url = authorization_url(FOUND, PROVIDER, "http://127.0.0.1:1/cb", "s1", "n1", challenge)
    assert url.startswith(ISSUER + "/auth?response_type=code&client_id=llmgw-console&")
    assert f"code_challenge={challenge}&code_challenge_method=S256" in url and "state=s1&nonce=n1" in url


def test_a_discovery_document_for_another_issuer_is_refused() -> None:
    doc = {"issuer": ISSUER, "authorization_endpoint": "a", "token_endpoint": "t", "jwks_uri": "j"}
    assert discovery_from(doc, ISSUER).algorithms == {"RS256"}
    with pytest.raises(SignInError, match="names issuer"):
        discovery_from(doc | {"issuer": ISSUER + "/"}, ISSUER)
    with pytest.raises(SignInError, match="signs ID tokens only with"):
        discovery_from(doc | {"id_token_signing_alg_values_supported": ["HS256"]}, ISSUER)
