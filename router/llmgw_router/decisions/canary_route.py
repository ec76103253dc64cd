"""Which endpoints a request may not use, before the scheduler scores the rest: a canary's share, and the
model checks' verdicts. Pure: the published endpoints, the request's needs and one random draw in.

- While a model's canary runs (its PublishedModel has `canary`), a request goes to the canary endpoints when
  it carries the canary header, or when the draw falls in the canary's weight; else to the stable ones.
  When the chosen group has nothing usable left (a canary that failed this request, a stable group gone),
  the other group serves it: a client never fails for the split.
- A request needing a checked capability (tools, a json_schema response_format) is not sent to an endpoint
  whose (model, engine version) check failed it, nor, for a `verified_only` model, to one whose check did
  not pass it (llmgw_router.decisions.capabilities: the rule, and the refusal when nothing is left).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.core.snapshot import Endpoint, PublishedModel
from llmgw_router.decisions.capabilities import usable

__all__ = ["steered_away"]


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
    them); `draw`: uniform in [0, 1); `needs`: what the request relies on (capabilities.needs_of); `failed`: the
    endpoints this request already failed on."""
    out: set[str] = set()
    for model in chain:
        published = models.get(model)
        strict = published is not None and published.verified_only
        eps = [ep for ep in endpoints.get(model, ()) if usable(ep, needs, strict)]
        out.update(ep.replica_id for ep in endpoints.get(model, ()) if not usable(ep, needs, strict))
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
