"""Federation (docs/routing.md, Federation): a peer's models as this cluster offers them. Pure.

The controller checks each peer (`llmgw.controller.loops.peers`) and keeps what it learned as a `PeerView`;
`peer_models` turns those views into the models routers are published: `PEER/MODEL`, served through the peer's
router as an external provider is, with its state. A peer whose `/ready` fails keeps its models, marked down
(out of routing until it answers again); a model the peer stops offering is gone, except one a fallback here
still names, which is kept withdrawn: a request for it is told so instead of meeting an unknown model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from llmgw.core.config.models import Capability, ProjectSpec
from llmgw.core.config.specs.peer_spec import PEER_SEPARATOR, Peer
from llmgw.core.snapshot import PublishedModel, PublishedPeer, PublishedProvider

__all__ = ["PeerCard", "PeerView", "kept_home", "parse_peer_models", "peer_models"]

_CAPABILITIES = frozenset(get_args(Capability))


@dataclass(frozen=True)
class PeerCard:
    """One model as the peer's /v1/models lists it."""

    name: str
    context_length: int
    capabilities: tuple[Capability, ...]


@dataclass
class PeerView:
    """What the controller last learned of one peer. `up` None: not checked yet."""

    up: bool | None = None
    checked_at: float | None = None  # wall clock of the last check
    latency_s: float | None = None  # how long its /ready took (None: it did not answer)
    why: str | None = None  # why it is down
    models: dict[str, PeerCard] = field(default_factory=dict)  # its last listing (kept while it is down)


def parse_peer_models(page: Any) -> dict[str, PeerCard]:
    """The cards of a peer's /v1/models answer; ValueError saying what is wrong with it. A card without a
    context length is left out: nothing could be sized against it."""
    data = page.get("data") if isinstance(page, dict) else None
    if not isinstance(data, list):
        raise ValueError("its /v1/models answer has no `data` list (is the url another llmgw's router?)")
    cards: dict[str, PeerCard] = {}
    for item in data:
        if not isinstance(item, dict):
            continue
        name, context = item.get("id"), item.get("context_length")
        if not isinstance(name, str) or not name or not isinstance(context, int) or context < 1:
            continue
        listed = item.get("capabilities")
        caps = tuple(c for c in listed if c in _CAPABILITIES) if isinstance(listed, list) else ()
        cards[name] = PeerCard(name, context, caps or ("chat", "completions"))
    return cards


def peer_models(
    peers: Sequence[Peer], views: Mapping[str, PeerView], named: Mapping[str, tuple[str, ...]]
) -> dict[str, PublishedModel]:
    """The models routers are published for the peers: each listed model as `PEER/MODEL` (up, or down while
    the peer's /ready fails), and every `PEER/MODEL` a fallback names that the peer does not list, withdrawn.
    `named`: the fallbacks' peer models by peer (Catalog.peer_fallbacks)."""
    out: dict[str, PublishedModel] = {}
    for peer in peers:
        view = views.get(peer.name) or PeerView()
        provider_url = peer.url + "/v1"
        state = "up" if view.up else "down"
        why = None if view.up else (view.why or "not checked yet")
        for card in view.models.values():
            out[peer.name + PEER_SEPARATOR + card.name] = PublishedModel(
                context_length=card.context_length,
                capabilities=list(card.capabilities),
                provider=PublishedProvider(url=provider_url, model=card.name, key=peer.key),
                peer=PublishedPeer(name=peer.name, region=peer.region, state=state, why=why),
            )
        for name in named.get(peer.name, ()):
            if name in out:
                continue
            upstream = name.partition(PEER_SEPARATOR)[2]
            gone = (
                f"peer {peer.name} does not offer {upstream} (its /v1/models no longer lists it)"
                if view.up is not None
                else why
            )
            out[name] = PublishedModel(
                context_length=1,
                capabilities=[],
                provider=PublishedProvider(url=provider_url, model=upstream, key=peer.key),
                peer=PublishedPeer(
                    name=peer.name,
                    region=peer.region,
                    state="withdrawn" if view.up is not None else "down",
                    why=gone,
                ),
            )
    return out


def kept_home(project: str, spec: ProjectSpec, peer: str, region: str | None) -> str | None:
    """Why `project`'s requests may not go to `peer` (of `region`), naming the rule; None when they may. The
    router refuses by it (403 kept_home), `plan` says which projects a change keeps off a peer."""
    if spec.no_store:
        return (
            f"Project `{project}` keeps its requests in this cluster (no_store: true); `{peer}` is a peer "
            "cluster, whose keeping of what it is sent is not this cluster's to govern."
        )
    if spec.residency is not None and region not in spec.residency:
        where = f"region `{region}`" if region else "no region"
        allowed = ", ".join(spec.residency) or "none: its requests stay in this cluster"
        return f"Project `{project}`'s residency allows regions {allowed}; peer `{peer}` declares {where}."
    return None
