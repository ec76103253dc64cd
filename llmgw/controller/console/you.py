"""What a signed-in person holds, asked afresh at every request: the repo's memberships (the applied revision)
combined with what their identity provider's groups give (as the provider last said, at most the Cluster's
`recheck` ago), by the rule of llmgw.core.tenancy.groups. The You page shows it; the chat page offers the models
of the projects it lets them use."""

from __future__ import annotations

from aiohttp import web

from llmgw.controller.console.signin import identity_provider
from llmgw.controller.console.web import controller, render, session_of
from llmgw.core.tenancy.groups import Held, combined, from_groups, project_role_among
from llmgw.core.tenancy.people import may, memberships_of

__all__ = ["held", "page", "usable_projects"]


def held(request: web.Request) -> list[Held]:
    session, d = session_of(request), controller(request).desired
    if session.kind != "person" or d is None:
        return []
    repo = memberships_of(session.name, d.catalog.tenants())
    provider = identity_provider(request)
    groups = session.person.groups if session.person is not None else ()
    granted = from_groups(groups, provider.groups) if provider is not None else []
    return combined(repo, granted)


def usable_projects(request: web.Request) -> list[str]:
    """The projects where the person's role lets them send requests (llmgw.core.tenancy.people's `use_models`)."""
    d = controller(request).desired
    if d is None:
        return []
    tenants, holding = d.catalog.tenants(), held(request)
    return sorted(p for p in tenants.projects if may(project_role_among(holding, p, tenants), "use_models"))


async def page(request: web.Request) -> web.StreamResponse:
    session = session_of(request)
    groups = session.person.groups if session.person is not None else ()
    return render(request, "you.html", held=held(request), groups=groups, projects=usable_projects(request))
