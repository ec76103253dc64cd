"""`GET /v1/models` and `GET /v1/models/{id}`: the models a caller may use, each with its capability card.

A caller sees only the models its project may use (when tenants apply) and that can be served now or loaded on
demand; a model it may not see is the same 404 as one that does not exist (never telling which).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmgw.core.snapshot import Endpoint, PublishedModel
from llmgw.core.tenancy.projects import has_tenants
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.path.lora import Adapters
from llmgw_router.server.errors import ApiError, error_response
from llmgw_router.server.exchange import HttpReply, json_reply

__all__ = ["models_page"]


def models_page(
    table: RoutingTable,
    project: str | None,
    one: str | None,
    schedulable: Callable[[RoutingTable, str], bool],
    adapters: Adapters,
) -> HttpReply:
    """The list (`one` None), or the card of the model `one` names (404 when the caller may not see it)."""
    data = []
    listed = project is not None and has_tenants(table.snapshot.tenants)
    for name, model in table.models.items() if one is None else _one(table, one):
        if listed and project is not None and not table.allowed(project, name, one or name):
            continue
        if not (model.on_demand or schedulable(table, name)):
            continue
        data.append(
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "llmgw-simulated" if model.simulated else "llmgw",
                "context_length": model.context_length,
                **_capability_card(model, [ep.spec for ep in table.endpoints.get(name, ())]),
                "aliases": list(model.aliases),
                "on_demand": model.on_demand,
            }
        )
    data += adapters.cards(
        table,
        one,
        project,
        lambda base, asked: (
            (not listed or project is None or table.allowed(project, base, asked))
            and (table.models[base].on_demand or schedulable(table, base))
        ),
    )
    if one is None:
        return json_reply({"object": "list", "data": data})
    if not data:
        return error_response(
            ApiError(
                404,
                f"The model `{one[:200]}` does not exist or you do not have access to it.",
                "model_not_found",
                param="model",
            )
        )
    return json_reply(data[0])


def _capability_card(model: PublishedModel, endpoints: list[Endpoint]) -> dict[str, Any]:
    """What /v1/models says of a model's capabilities: the effective set (its kind's defaults, plus what it
    declares, less `without`), what it lacks, and the checked ones passed (`verified_capabilities`) and
    failed on every replica serving now (`failed_capabilities`: a request needing one is refused)."""
    failed = set.intersection(*(set(ep.failed) for ep in endpoints)) if endpoints else set()
    return {
        "capabilities": list(model.capabilities),
        "without": list(model.without),
        "verified_capabilities": sorted({p for ep in endpoints for p in ep.verified}),
        "failed_capabilities": sorted(failed),
        "verified_only": model.verified_only,
    }


def _one(table: RoutingTable, name: str) -> list[tuple[str, PublishedModel]]:
    """The model `name` names, by its id or an alias (what a request may name, retrieve may ask about)."""
    canonical = table.resolve(name)
    return [] if canonical is None else [(canonical, table.models[canonical])]
