"""What an identity provider's groups give a person, and how that combines with the repo's memberships (issue 44).
Pure. docs/tenancy.md, Groups, states the rule:

* a group listed in the Cluster's `console.identity_provider.groups` gives each of its grants (a role in an
  organization, team or project) to every person the provider says is in it;
* the person's memberships are the repo's and the groups' together (a union), except that where the repo gives
  the person a role in a scope, that role is theirs there whatever a group says (the repo wins, a stronger
  group role as much as a weaker one): the repo is reviewed, a group membership is not;
* where several groups grant roles in the same scope, the strongest holds.
A person's role in a project is then the strongest of their roles on it, its team and its organization, as for
the repo's memberships alone (llmgw.core.tenancy.people).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.core.config.specs.console_spec import GroupGrant
from llmgw.core.snapshot import Tenants
from llmgw.core.tenancy.people import ROLES, Membership, Role, ScopeKind, role_in_project

__all__ = ["Held", "combined", "from_groups", "project_role_among"]


@dataclass(frozen=True)
class Held:
    """A membership and where it comes from: "repo", or the group that gave it."""

    membership: Membership
    source: str


def _scope(grant: GroupGrant) -> tuple[ScopeKind, str]:
    if grant.organization is not None:
        return "organization", grant.organization
    if grant.team is not None:
        return "team", grant.team
    return "project", grant.project or ""


def from_groups(groups: Iterable[str], mapping: Mapping[str, list[GroupGrant]]) -> list[Held]:
    """The memberships the person's groups give, the strongest per scope; a group the mapping does not name
    gives nothing."""
    best: dict[tuple[ScopeKind, str], Held] = {}
    for group in sorted(set(groups)):
        for grant in mapping.get(group, []):
            kind, name = _scope(grant)
            held = best.get((kind, name))
            if held is None or ROLES.index(grant.role) > ROLES.index(held.membership.role):
                best[(kind, name)] = Held(Membership(kind, name, grant.role), f"group {group}")
    return list(best.values())


def combined(repo: Iterable[Membership], granted: Iterable[Held]) -> list[Held]:
    """The repo's memberships, then each group grant for a scope the repo gives the person no role in."""
    out = [Held(m, "repo") for m in repo]
    in_repo = {(h.membership.scope_kind, h.membership.scope_name) for h in out}
    out += [h for h in granted if (h.membership.scope_kind, h.membership.scope_name) not in in_repo]
    return out


def project_role_among(held: Iterable[Held], project: str, tenants: Tenants) -> Role | None:
    """The strongest role `held` gives in `project` (people.role_in_project, over memberships of any source)."""
    return role_in_project((h.membership for h in held), project, tenants)
