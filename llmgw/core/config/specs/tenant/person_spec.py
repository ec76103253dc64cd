"""A Person of the cluster repo (issue 44): who they are and where they belong, never their credentials. In its
own module to keep models.py within its size. Roles and what they allow: llmgw.core.tenancy.people."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from llmgw.core.config.base import Budget, Name, Strict

__all__ = ["EMAIL_PATTERN", "MemberRole", "MembershipSpec", "PersonLimits", "PersonSpec"]

MemberRole = Literal["member", "maintainer", "viewer"]

# One @, something on each side, a dot in the domain and no whitespace: enough to catch a name typed where an
# address was meant; whether the address is real is the identity provider's business.
EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"


class MembershipSpec(Strict):
    """One scope the person belongs to, with a role there: exactly one of organization, team or project."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["organization"]}, {"required": ["team"]}, {"required": ["project"]}]
        }
    )

    organization: Name | None = Field(None, description="An Organization (covers its teams and projects)")
    team: Name | None = Field(None, description="A Team (covers its projects)")
    project: Name | None = Field(None, description="A Project")
    role: MemberRole = Field("member", description="member, maintainer or viewer (docs/tenancy.md, Roles)")

    @model_validator(mode="after")
    def _one_scope(self) -> MembershipSpec:
        named = [s for s in (self.organization, self.team, self.project) if s is not None]
        if len(named) != 1:
            raise ValueError("a membership names exactly one of `organization`, `team` or `project`")
        return self


class PersonLimits(Strict):
    """A person's own limits, across every key and project they spend through, or each member's share of a
    scope (`per_member`); unset: none."""

    rpm: int | None = Field(None, ge=0, description="Requests per minute")
    tpm: int | None = Field(None, ge=0, description="Tokens per minute (prompt + completion)")
    concurrency: int | None = Field(None, ge=0, description="Requests in flight at once")
    budget: Budget | None = Field(None, description="Spending limit per period")


class PersonSpec(Strict):
    """A person: an email, the scopes they belong to (none is allowed) and their own limits."""

    email: str = Field(pattern=EMAIL_PATTERN, description="The address the identity provider vouches for")
    memberships: list[MembershipSpec] = Field(
        default_factory=list,
        description="Organizations, teams and projects this person belongs to, with a role",
    )
    limits: PersonLimits = Field(default_factory=PersonLimits)
