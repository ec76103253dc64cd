"""Which endpoints a request may not use, before the scheduler scores the rest: a canary's share, and the
model checks' verdicts. Pure: the published endpoints, the request's needs and one random draw in.

- While a model's canary runs (its PublishedModel has `canary`), a request goes to the canary endpoints when
  it carries the canary header, or when the draw falls in the canary's weight; else to the stable ones.
  When the chosen group has nothing usable left (a canary that failed this request, a stable group gone),
  the other group serves it: a client never fails for the split.
- A request offering tools is never sent to an endpoint whose engine failed the tools probe
  (`llmgw model check`); `refusal` says so when no endpoint is left at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.core.snapshot import Endpoint, PublishedModel

__all__ = ["refusal", "steered_away"]


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
    them); `draw`: uniform in [0, 1); `needs`: the probes the request relies on (tools); `failed`: the
    endpoints this request already failed on."""
    out: set[str] = set()
    for model in chain:
        eps = [ep for ep in endpoints.get(model, ()) if not (needs & set(ep.failed))]
        out.update(ep.replica_id for ep in endpoints.get(model, ()) if needs & set(ep.failed))
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


def refusal(
    endpoints: Mapping[str, Sequence[Endpoint]], chain: Sequence[str], needs: frozenset[str]
) -> str | None:
    """Words for a request no endpoint of its chain may serve because each failed a probe it needs; None
    when some endpoint may (or the chain has none at all: that is the scheduler's 503)."""
    eps = [ep for model in chain for ep in endpoints.get(model, ())]
    if not needs or not eps or any(not (needs & set(ep.failed)) for ep in eps):
        return None
    names = ", ".join(f"`{m}`" for m in chain)
    what = ", ".join(sorted(needs))
    return (
        f"No replica of {names} passed the {what} check: its engine failed the probe "
        f"(`llmgw model check` says why); the request is not sent where it would be answered wrongly."
    )
