"""Which endpoints a request may not use, before the scheduler scores the rest: a canary's share, and the
model checks' verdicts. Pure: the published endpoints, the request's needs and one random draw in.

- While a model's canary runs (its PublishedModel has `canary`), a request goes to the canary endpoints when
  it carries the canary header, or when the draw falls in the canary's weight; else to the stable ones.
  When the chosen group has nothing usable left (a canary that failed this request, a stable group gone),
  the other group serves it: a client never fails for the split.
- A request needing a capability a model check verifies (`needs_of`: tools, a json_schema response_format)
  is sent only to endpoints whose (model, engine version) verdict passed that probe: unknown is not
  verified. `refusal` says why when no endpoint of the chain is left (unchecked, failed and the check's
  hint, or a check in progress) and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmgw.core.snapshot import Endpoint, PublishedModel

__all__ = ["Refusal", "listed_capabilities", "needs_of", "refusal", "steered_away", "usable"]

# A check in progress ends in seconds (a few short requests to one replica): the client may ask again then.
CHECKING_RETRY_AFTER_S = 5


def needs_of(body: Mapping[str, Any]) -> frozenset[str]:
    """The probes a chat request relies on: `tools` when it offers tools it lets the model call (a
    tool_choice of "none" does not), `response_format` when it asks for a json_schema answer. Stream usage
    is not routed on: the router asks every stream for it (its own accounting), so gating streams on the
    probe would strand every stream of an unchecked model."""
    out = set()
    tools = body.get("tools")
    if isinstance(tools, list) and tools and body.get("tool_choice") != "none":
        out.add("tools")
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        out.add("response_format")
    return frozenset(out)


# Declared capabilities a model check must verify before a router relies on them (the probe of the same name).
# The others (chat, completions, embeddings, ...) are served by any ready replica: readiness is their check.
PROBED_CAPABILITIES = frozenset({"tools"})


def listed_capabilities(declared: Sequence[str], endpoints: Sequence[Endpoint]) -> list[str]:
    """What /v1/models lists as the model's `capabilities`: the declared ones, less each probed one that no
    endpoint serving now verified (a request needing it would be refused)."""
    verified = {p for ep in endpoints for p in ep.verified}
    return [c for c in declared if c not in PROBED_CAPABILITIES or c in verified]


def usable(ep: Endpoint, needs: frozenset[str]) -> bool:
    """The endpoint's verdict passed every probe the request needs."""
    return not needs or needs <= set(ep.verified)


def steered_away(
    endpoints: Mapping[str, Sequence[Endpoint]],
    models: Mapping[str, PublishedModel],
    chain: Sequence[str],
    *,
    headers: Mapping[str, str],
    draw: float,
    needs: frozenset[str],
    failed: frozenset[str],
) -> frozenset[str]:
    """Endpoint ids this request must not be sent to. `headers`: the request's (as the exchange reads
    them); `draw`: uniform in [0, 1); `needs`: the probes the request relies on (`needs_of`); `failed`: the
    endpoints this request already failed on."""
    out: set[str] = set()
    for model in chain:
        eps = [ep for ep in endpoints.get(model, ()) if usable(ep, needs)]
        out.update(ep.replica_id for ep in endpoints.get(model, ()) if not usable(ep, needs))
        published = models.get(model)
        route = published.canary if published is not None else None
        if route is None or not any(ep.canary for ep in eps):
            continue
        to_canary = (
            route.header is not None and headers.get(route.header) is not None
        ) or draw * 100 < route.weight
        chosen = [ep for ep in eps if ep.canary == to_canary and ep.replica_id not in failed]
        if chosen:
            out.update(ep.replica_id for ep in eps if ep.canary != to_canary)
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why no endpoint may serve the request. `checking`: a check that would decide is in progress (the
    router answers 503 with Retry-After: asking again soon may succeed); else 400 (asking again will not
    help until an operator acts)."""

    message: str
    checking: bool
    param: str


def refusal(
    endpoints: Mapping[str, Sequence[Endpoint]], chain: Sequence[str], needs: frozenset[str]
) -> Refusal | None:
    """The refusal of a request no endpoint of its chain (the model, then its fallbacks) may serve for want
    of a verified capability; None when some endpoint may (or the chain has none at all: that is the
    scheduler's 503)."""
    eps = [ep for model in chain for ep in endpoints.get(model, ())]
    if not needs or not eps or any(usable(ep, needs) for ep in eps):
        return None
    missing = sorted(p for p in needs if not any(p in ep.verified for ep in eps))
    probe = missing[0] if missing else sorted(needs)[0]
    names = ", ".join(f"`{m}`" for m in chain)
    checking = any(ep.checking for ep in eps)
    hints = sorted({ep.failed_details.get(probe, "") for ep in eps if probe in ep.failed} - {""})
    if checking:
        state = "its model check is in progress; ask again in a few seconds"
    elif hints:
        state = f"the check failed: {hints[0]}"
    elif any(probe in ep.failed for ep in eps):
        state = "the check failed"
    else:
        state = "it was never checked"
    what = " and ".join(missing) if missing else probe
    return Refusal(
        f"No replica of {names} is verified for {what}: {state}. The request is not sent where it could be "
        f"answered wrongly; run `llmgw model check {chain[0]}` (docs/canaries.md, Model checks).",
        checking,
        "tools" if probe == "tools" else "response_format",
    )
