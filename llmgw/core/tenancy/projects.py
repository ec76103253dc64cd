"""Which tenants a project belongs to and which models it may use, read from the published `Tenants` (what a
router is told). Pure. The level words are the limiter's: organization, team, project."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from llmgw.core.snapshot import Tenants
from llmgw.core.tenancy.limits import Tenant, level_limits

__all__ = ["TenantChain", "allowed", "has_tenants", "tenant_chain"]


@dataclass(frozen=True)
class TenantChain:
    """The project and its parents, each with its limits as the limiter reads them. Unknown parents are absent."""

    project: str
    team: str | None
    organization: str | None
    levels: tuple[Tenant, ...]  # organization first, then team, then project (the limiter's order)


def tenant_chain(tenants: Tenants, project: str) -> TenantChain | None:
    """None when the project is not in the snapshot's tenants."""
    spec = tenants.projects.get(project)
    if spec is None:
        return None
    levels = [Tenant("project", project, level_limits(spec.limits))]
    team = spec.team
    org = spec.organization
    if team is not None and team in tenants.teams:
        levels.append(Tenant("team", team, level_limits(tenants.teams[team].limits)))
        org = tenants.teams[team].organization
    if org is not None and org in tenants.organizations:
        levels.append(Tenant("organization", org, level_limits(tenants.organizations[org].limits)))
    return TenantChain(project, team, org, tuple(reversed(levels)))


def _lists(tenants: Tenants, project: str) -> list[list[str] | None]:
    """The model lists of the project, its team and its organization (None where a level sets none)."""
    spec = tenants.projects[project]
    lists: list[list[str] | None] = [spec.models]
    org = spec.organization
    if spec.team is not None and spec.team in tenants.teams:
        team = tenants.teams[spec.team]
        lists.append(team.models)
        org = team.organization
    if org is not None and org in tenants.organizations:
        lists.append(tenants.organizations[org].models)
    return lists


def allowed(tenants: Tenants, project: str, names: tuple[str, ...]) -> bool:
    """May `project` use a model known by any of `names` (its name, aliases, the name asked for)?

    As the catalog decides it: every level that lists models must allow it (a level without a list inherits
    its parent's); globs are allowed in lists; an unknown project is refused.
    """
    if project not in tenants.projects:
        return False
    for patterns in _lists(tenants, project):
        if patterns is not None and not any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names):
            return False
    return True


def has_tenants(tenants: Tenants) -> bool:
    """Does the snapshot declare any tenant? One with none (a static router with a keys file) lets every key
    use every model."""
    return bool(tenants.projects or tenants.teams or tenants.organizations)
