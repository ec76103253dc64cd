"""Which project's allowlist and limits a request answers to: the project its key (or header) names, when the
cluster repo declares it; a project the repo does not know is refused while tenants apply (403), and so is a
model its allowlist leaves out."""

from __future__ import annotations

from llmgw.core.tenancy.projects import has_tenants
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.server.errors import ApiError

__all__ = ["tenant_project"]


def tenant_project(table: RoutingTable, project: str | None, canonical: str, asked_as: str) -> str | None:
    """The tenant project whose allowlist and limits apply (None: no tenants apply), or 403."""
    tenants = table.snapshot.tenants
    if project is not None and project not in tenants.projects and has_tenants(tenants):
        raise ApiError(
            403, f"Project `{project}` is not in the cluster repo.", "unknown_project", "permission_error"
        )
    tenant_project = project if project is not None and project in tenants.projects else None
    if tenant_project is not None and not table.allowed(tenant_project, canonical, asked_as):
        raise ApiError(
            403,
            f"Project `{tenant_project}` may not use model `{canonical}`.",
            "model_not_allowed",
            "permission_error",
            param="model",
        )
    return tenant_project
