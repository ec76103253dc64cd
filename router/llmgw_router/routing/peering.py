"""Federation on the request path (docs/routing.md, Federation): the thin shell over the pure rules in
llmgw_router.decisions.federation, which say why; here they are asked of the routing table and raised."""

from __future__ import annotations

from llmgw.core.snapshot import PublishedPeer
from llmgw_router.decisions.federation import (
    HOP_HEADER,
    hop_refusal,
    peer_refusal,
    peer_usable,
    withdrawn,
)
from llmgw_router.fleet.table import RoutingTable

__all__ = ["HOP_HEADER", "arrived", "peer_chain", "refuse_withdrawn"]


def arrived(table: RoutingTable, hops: str | None) -> str | None:
    """The hop header a request came with (None: not from a peer); 508 when it came round a loop back here."""
    if hops is not None:
        refused = hop_refusal(hops, table.snapshot.cluster)
        if refused is not None:
            raise refused
    return hops


def refuse_withdrawn(canonical: str, peer: PublishedPeer) -> None:
    """404 for a peer's model the peer no longer offers: it serves nothing, so this is said before anything."""
    if peer.state == "withdrawn":
        raise withdrawn(canonical, peer)


def peer_chain(
    table: RoutingTable, canonical: str, serving: tuple[str, ...], project: str | None
) -> tuple[str, ...]:
    """The chain without the peers' models this request may not reach now (a peer down, a model withdrawn, the
    project's no_store or residency); the asked-for model is refused, saying why, when it is one and no
    fallback is left to serve."""
    spec = table.snapshot.tenants.projects.get(project) if project is not None else None
    rest = tuple(m for m in serving[1:] if peer_usable(table.models[m], project, spec))
    refused = peer_refusal(canonical, table.models[canonical], project, spec, bool(rest))
    if refused is not None:
        raise refused
    return (serving[0], *rest)
