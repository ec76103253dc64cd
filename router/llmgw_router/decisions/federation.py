"""Federation on the request path (docs/routing.md, Federation). Pure.

A peer's model (`PEER/MODEL`) is served through the peer's router, as an external provider is. Three things
are decided here:

- the hop header: a request sent to a peer carries `x-llmgw-hop`, the clusters it passed through (their names,
  comma-separated, this one last); a request that arrives naming this cluster came back round a loop of peers
  and is refused 508 before anything else is done;
- whether a project's request may leave the cluster: `no_store` keeps all of them home, `residency` only lets
  them go to a peer of a listed region;
- whether a peer's model may be sent anything now: not while its peer is down, never once withdrawn.
"""

from __future__ import annotations

from llmgw.core.config.models import ProjectSpec
from llmgw.core.fleet.federation import kept_home
from llmgw.core.snapshot import PublishedModel, PublishedPeer
from llmgw_router.server.errors import ApiError

__all__ = ["HOP_HEADER", "hop_refusal", "next_hops", "peer_refusal", "peer_usable", "withdrawn"]

HOP_HEADER = "x-llmgw-hop"
MAX_HOPS = 8  # a chain of peers longer than this is a loop that passed through differently named clusters


def hop_refusal(header: str | None, cluster: str | None) -> ApiError | None:
    """508 when the request already passed through `cluster` (or through too many), else None."""
    if header is None:
        return None
    passed = [h.strip() for h in header.split(",") if h.strip()]
    if cluster is not None and cluster in passed:
        return ApiError(
            508,
            f"Loop between peers: this request already passed through cluster `{cluster}` "
            f"({HOP_HEADER}: {', '.join(passed)}); a model's fallbacks on two peers name each other's models.",
            "peer_loop",
            "server_error",
        )
    if len(passed) >= MAX_HOPS:
        return ApiError(
            508,
            f"This request passed through {len(passed)} clusters ({HOP_HEADER}: {', '.join(passed)}); "
            f"at most {MAX_HOPS} hops are followed.",
            "peer_loop",
            "server_error",
        )
    return None


def next_hops(header: str | None, cluster: str | None) -> str:
    """The hop header a request sent on to a peer carries: the clusters it passed through, then this one."""
    here = cluster or "unnamed"
    return f"{header},{here}" if header else here


def _kept_home(project: str, spec: ProjectSpec, model: PublishedModel) -> str | None:
    peer = model.peer
    return None if peer is None else kept_home(project, spec, peer.name, peer.region)


def peer_usable(model: PublishedModel, project: str | None, spec: ProjectSpec | None) -> bool:
    """May a fallback that is a peer's model take this request now? (Any other model: yes.)"""
    peer = model.peer
    if peer is None:
        return True
    if peer.state != "up":
        return False
    return project is None or spec is None or _kept_home(project, spec, model) is None


def withdrawn(name: str, peer: PublishedPeer) -> ApiError:
    """404 for a peer's model the peer no longer offers (kept, withdrawn, because a fallback names it)."""
    return ApiError(
        404,
        f"The model `{name}` was withdrawn by peer `{peer.name}`: {peer.why}. A fallback here still names it; "
        "ask for another model.",
        "model_withdrawn",
        param="model",
    )


def peer_refusal(
    name: str, model: PublishedModel, project: str | None, spec: ProjectSpec | None, fallbacks: bool
) -> ApiError | None:
    """Why the asked-for model `name`, a peer's, cannot take the request, or None. A peer down or a model
    withdrawn is refused only when no fallback is left (`fallbacks` False): then the fallbacks serve it."""
    peer = model.peer
    if peer is None:
        return None
    if project is not None and spec is not None:
        why = _kept_home(project, spec, model)
        if why is not None:
            return ApiError(403, why, "kept_home", "permission_error", param="model")
    if peer.state == "up" or fallbacks:
        return None
    if peer.state == "withdrawn":
        return withdrawn(name, peer)
    return ApiError(
        503,
        f"The model `{name}` is served by peer `{peer.name}`, which is down ({peer.why}); it is out of routing "
        "until its /ready answers again.",
        "peer_unavailable",
        "server_error",
        headers={"Retry-After": "5"},
    )
