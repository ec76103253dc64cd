"""What a plan does to federation (docs/routing.md, Federation), as Impact items. Pure.

Against the window's traffic: a peer removed, or a project's `no_store` or `residency` that now keeps it off
a peer, takes the `PEER/MODEL` models it used away (a loss). Beside it, notes: a peer added (its models are
offered once the controller reaches it), a peer removed or moved, and every fallback naming a `PEER/MODEL`
the peer does not offer now (kept withdrawn: a request for it is refused, saying so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from llmgw.core.config.models import ClusterSpec
from llmgw.core.config.specs.peer_spec import PEER_SEPARATOR, Peer, peer_of
from llmgw.core.fleet.federation import kept_home
from llmgw.core.plan.values import ImpactItem
from llmgw.core.traffic.usage_summary import UsageSummary

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog
    from llmgw.core.fleet.views import LiveState

__all__ = ["applied_peers", "peer_impact"]


def applied_peers(documents: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Peer]:
    """The applied revision's peers, from the live state's documents; empty when not known."""
    for doc in (documents or {}).values():
        if doc.get("kind") == "Cluster":
            try:
                return {p.name: p for p in ClusterSpec.model_validate(doc.get("spec") or {}).peers}
            except ValidationError:
                return {}  # written by another version: no peer judged, none guessed
    return {}


def peer_impact(usage: UsageSummary, catalog: Catalog, live: LiveState, window: str) -> list[ImpactItem]:
    old = applied_peers(live.documents)
    new = {p.name: p for p in catalog.cluster.peers}
    return [*_losses(usage, catalog, old, new, window), *_notes(catalog, live, old, new)]


def _losses(
    usage: UsageSummary, catalog: Catalog, old: dict[str, Peer], new: dict[str, Peer], window: str
) -> list[ImpactItem]:
    out = []
    projects = catalog.tenants().projects
    for pair in usage.pairs:
        found = peer_of(pair.model, old)
        if found is None or pair.requests == 0 or not pair.project:
            continue
        peer = found[0]
        sent = f"project {pair.project} sent {pair.requests:,} request{'s' * (pair.requests != 1)} to {pair.model}"
        if peer not in new:
            why = f"removes peer {peer}: {sent} in {window}"
        else:
            spec = projects.get(pair.project)
            rule = None if spec is None else kept_home(pair.project, spec, peer, new[peer].region)
            if rule is None:
                continue
            why = f"keeps project {pair.project} off peer {peer}, where {sent} in {window}: {rule}"
        out.append(ImpactItem("loss", "access", f"project {pair.project}", why))
    return out


def _notes(catalog: Catalog, live: LiveState, old: dict[str, Peer], new: dict[str, Peer]) -> list[ImpactItem]:
    out = []
    for name in sorted(new.keys() - old.keys()):
        out.append(
            ImpactItem(
                "note",
                "access",
                f"peer {name}",
                f"adds peer {name} ({new[name].url}): its models are offered here as {name}{PEER_SEPARATOR}MODEL "
                "once the controller reaches its /ready and reads its /v1/models with its key",
            )
        )
    for name in sorted(old.keys() - new.keys()):
        out.append(
            ImpactItem("note", "access", f"peer {name}", f"removes peer {name}: its {name}/MODEL models go")
        )
    for name in sorted(old.keys() & new.keys()):
        if old[name].url != new[name].url:
            words = f"moves peer {name} from {old[name].url} to {new[name].url}"
            out.append(ImpactItem("note", "access", f"peer {name}", words))
    known = live.peers or {}
    for peer, names in sorted(catalog.peer_fallbacks().items()):
        seen = known.get(peer)
        if seen is None or seen.up is None:
            continue  # not checked yet: what it offers is not known
        for full in names:
            model = full.partition(PEER_SEPARATOR)[2]
            if model not in seen.models:
                out.append(
                    ImpactItem(
                        "note",
                        "access",
                        f"model {full}",
                        f"a fallback names {full}, which peer {peer} does not offer now: it is kept withdrawn "
                        "(a request for it is refused 404 model_withdrawn; the chain skips it)",
                    )
                )
    return out
