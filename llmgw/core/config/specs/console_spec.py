"""The Cluster's `console`: how people sign in (an OpenID Connect provider, its groups) and how long the chat
page keeps their threads (issue 44). In its own module to keep models.py and cluster_spec.py within their size.
docs/tenancy.md, Signing in, says how these are used."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from llmgw.core.config.base import Duration, SecretRef, Strict
from llmgw.core.config.specs.tenant.person_spec import MembershipSpec
from llmgw.core.security import is_loopback_host
from llmgw.core.words import parse_duration

__all__ = ["ConsoleSettings", "GroupGrant", "IdentityProvider", "ThreadSettings"]

# What a group gives its members: a role in one organization, team or project, written as a Person's membership is.
GroupGrant = MembershipSpec


class ThreadSettings(Strict):
    """The chat page's conversations."""

    retention: Duration = Field(
        "30d",
        description="How long a person's chat thread is kept after its last message; the controller deletes it "
        "then (its owner may delete it sooner)",
    )

    @field_validator("retention")
    @classmethod
    def _positive(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"retention must be longer than zero (got {value!r}; e.g. 30d)")
        return value


class IdentityProvider(Strict):
    """An OpenID Connect provider people sign in to the console with (authorization code with PKCE)."""

    issuer: str = Field(
        description="The provider's issuer URL, exactly as its ID tokens say (`iss`); its discovery document is "
        "ISSUER/.well-known/openid-configuration. https, or http on a loopback host only"
    )
    client_id: str = Field(min_length=1, description="The console's client id at the provider")
    client_secret: SecretRef = Field(
        description="The console's client secret (sent to the provider's token endpoint only: bind it in "
        "bindings.yaml with purpose oidc-client-secret and the issuer's host)"
    )
    scopes: list[str] = Field(
        default_factory=lambda: ["openid", "email", "profile"],
        description="Scopes asked for; `openid` is always asked for",
    )
    groups_claim: str | None = Field(
        None,
        description="The ID token claim listing the person's groups (e.g. `groups`); unset: groups unused",
    )
    groups: dict[str, list[GroupGrant]] = Field(
        default_factory=dict,
        description="Provider group -> what its members get here; combined with the repo's memberships "
        "(docs/tenancy.md, Groups)",
    )
    recheck: Duration = Field(
        "30s",
        description="A signed-in person's groups are asked of the provider again (its userinfo endpoint, with "
        "their access token) at their first request this long after the last answer; a person removed from a "
        "group loses what it gave then. 0s: at every request",
    )

    @field_validator("issuer")
    @classmethod
    def _issuer_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"issuer must be an https URL (got {value!r}; e.g. https://login.example.com)")
        if parts.scheme == "http" and not is_loopback_host(parts.hostname):
            raise ValueError(
                f"issuer {value!r} is plain http on a network host: use https (http: loopback only)"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"issuer {value!r} has a query or fragment; an issuer URL has neither")
        return value

    @model_validator(mode="after")
    def _groups_need_claim(self) -> IdentityProvider:
        if self.groups and self.groups_claim is None:
            raise ValueError(
                "`groups` maps the provider's groups but `groups_claim` names no claim to read them"
            )
        return self


class ConsoleSettings(Strict):
    """The web console's sign-in and chat page (docs/console.md)."""

    identity_provider: IdentityProvider | None = Field(
        None,
        description="People sign in with this OpenID Connect provider; unset: with a password set through a "
        "one-time link an admin issues (`llmgw person password-link NAME`)",
    )
    threads: ThreadSettings = Field(default_factory=ThreadSettings)
