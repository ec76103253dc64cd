"""People: where a person belongs, in which role, and what each role may see and do. Pure.

A person is a `Person` document of the cluster repo (`metadata.name`, `spec.email`, `spec.memberships`), published
to routers in the snapshot's `Tenants.people`, so the controller (over `Catalog.tenants()`) and every router answer
these questions over the same data. Membership of an organization or a team covers the projects beneath it; a
person's role in a project is the strongest of their roles on the project, its team and its organization.
docs/tenancy.md, People, has the roles table this module's `ROLE_TABLE` is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from llmgw.core.config.specs.tenant.person_spec import MemberRole, PersonLimits
from llmgw.core.snapshot import Tenants
from llmgw.core.tenancy.limits import Budget, LevelLimits, Tenant
from llmgw.core.tenancy.projects import TenantChain
from llmgw.core.words import parse_duration

__all__ = [
    "ACTIONS",
    "ROLES",
    "ROLE_TABLE",
    "Action",
    "Membership",
    "Role",
    "ScopeKind",
    "may",
    "member_level",
    "memberships_of",
    "person_chain",
    "project_role",
    "role_in_project",
    "scope_role",
]

Role = MemberRole  # "member" | "maintainer" | "viewer"
ScopeKind = Literal["organization", "team", "project"]
ROLES: tuple[Role, ...] = (
    "viewer",
    "member",
    "maintainer",
)  # weakest first: a stronger role may all a weaker may

Action = Literal[
    "view_usage",  # the scope's usage, by person, key and model
    "view_keys",  # the scope's keys: ids, names, owners, states (never a secret)
    "use_models",  # send requests there: a personal key works, the console's chat page answers
    "create_personal_key",  # a key of one's own, scoped there
    "create_project_key",  # a key of the project, owned by nobody
    "revoke_key",  # any key scoped there (a person may always revoke their own)
]
ACTIONS: tuple[Action, ...] = (
    "view_usage",
    "view_keys",
    "use_models",
    "create_personal_key",
    "create_project_key",
    "revoke_key",
)

# What each role may do in a scope it holds (and the scopes beneath it). One table, read by the admin API and the
# console alike through `may`; docs/tenancy.md prints it.
ROLE_TABLE: dict[Action, frozenset[Role]] = {
    "view_usage": frozenset({"viewer", "member", "maintainer"}),
    "view_keys": frozenset({"viewer", "member", "maintainer"}),
    "use_models": frozenset({"member", "maintainer"}),
    "create_personal_key": frozenset({"member", "maintainer"}),
    "create_project_key": frozenset({"maintainer"}),
    "revoke_key": frozenset({"maintainer"}),
}


@dataclass(frozen=True, slots=True)
class Membership:
    """One scope a person belongs to, as declared: `(scope_kind, scope_name, role)`."""

    scope_kind: ScopeKind
    scope_name: str
    role: Role


def may(role: Role | None, action: Action) -> bool:
    """May a person holding `role` in a scope do `action` there? None (no role: not a member) may nothing."""
    return role is not None and role in ROLE_TABLE[action]


def memberships_of(person_name: str, desired_state: Tenants) -> list[Membership]:
    """The scopes `person_name` is declared a member of, in the order written; [] for a person not declared.
    `desired_state` is the published tenant tree (`Catalog.tenants()` on the controller, the snapshot's
    `tenants` on a router)."""
    person = desired_state.people.get(person_name)
    if person is None:
        return []
    out: list[Membership] = []
    for m in person.memberships:
        if m.organization is not None:
            out.append(Membership("organization", m.organization, m.role))
        elif m.team is not None:
            out.append(Membership("team", m.team, m.role))
        elif m.project is not None:
            out.append(Membership("project", m.project, m.role))
    return out


def _strongest(roles: list[Role]) -> Role | None:
    return max(roles, key=ROLES.index) if roles else None


def scope_role(
    person_name: str, scope_kind: ScopeKind, scope_name: str, desired_state: Tenants
) -> Role | None:
    """The person's role in a scope: the strongest held on it or on a scope above it; None for no role there."""
    if scope_kind == "project":
        return project_role(person_name, scope_name, desired_state)
    covering: set[tuple[str, str]] = {(scope_kind, scope_name)}
    if scope_kind == "team" and scope_name in desired_state.teams:
        covering.add(("organization", desired_state.teams[scope_name].organization))
    held = memberships_of(person_name, desired_state)
    return _strongest([m.role for m in held if (m.scope_kind, m.scope_name) in covering])


def project_role(person_name: str, project: str, desired_state: Tenants) -> Role | None:
    """The person's role in `project`: the strongest of their roles on it, its team and its organization.
    None when they hold none there, or the project is not declared."""
    return role_in_project(memberships_of(person_name, desired_state), project, desired_state)


def role_in_project(held: Iterable[Membership], project: str, desired_state: Tenants) -> Role | None:
    """The strongest role `held` gives in `project`: on it, its team or its organization. None: no role there
    (or the project is not declared). The one place a project's covering scopes are worked out."""
    spec = desired_state.projects.get(project)
    if spec is None:
        return None
    covering: set[tuple[str, str]] = {("project", project)}
    org = spec.organization
    if spec.team is not None:
        covering.add(("team", spec.team))
        team = desired_state.teams.get(spec.team)
        org = team.organization if team is not None else None
    if org is not None:
        covering.add(("organization", org))
    return _strongest([m.role for m in held if (m.scope_kind, m.scope_name) in covering])


def _limits(declared: PersonLimits) -> LevelLimits:
    budget = declared.budget
    return LevelLimits(
        rpm=declared.rpm,
        tpm=declared.tpm,
        concurrency=declared.concurrency,
        budget=Budget(budget.amount, parse_duration(budget.period)) if budget is not None else None,
    )


def member_level(person_name: str, scope_kind: ScopeKind, scope_name: str, share: PersonLimits) -> Tenant:
    """One person's own share of a scope's `per_member` limits: a pool of its own, `PERSON@KIND/SCOPE`."""
    return Tenant("member", f"{person_name}@{scope_kind}/{scope_name}", _limits(share))


def _per_member(desired_state: Tenants, level: Tenant) -> PersonLimits | None:
    """The `per_member` share a level of a project's chain declares (None: none)."""
    if level.level == "organization":
        org = desired_state.organizations.get(level.name)
        return org.per_member if org is not None else None
    if level.level == "team":
        team = desired_state.teams.get(level.name)
        return team.per_member if team is not None else None
    project = desired_state.projects.get(level.name)
    return project.per_member if project is not None else None


def person_chain(chain: TenantChain, person_name: str, desired_state: Tenants) -> TenantChain:
    """The levels a person's request in `chain`'s project is charged to: the project's chain, then their share
    of every scope of it that sets `per_member`, then the person's own limits (across every key and project).
    Levels that limit nothing are left out, as the limiter would skip them anyway."""
    shares: list[Tenant] = []
    for level in chain.levels:  # organization, team, project
        share = _per_member(desired_state, level)
        if share is not None:
            kind: ScopeKind = level.level  # type: ignore[assignment]  # the chain holds these three only
            shares.append(member_level(person_name, kind, level.name, share))
    person = desired_state.people.get(person_name)
    if person is not None and _limits(person.limits) != LevelLimits():
        shares.append(Tenant("person", person_name, _limits(person.limits)))
    return TenantChain(chain.project, chain.team, chain.organization, chain.levels + tuple(shares))
