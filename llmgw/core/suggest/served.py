"""What a replayed fleet costs and whether it met the objectives: per model and traffic class (project), its
p90 and p99 time to first token, p99 time per output token and availability against what the repo declares,
and the fleet's cost per hour and per million tokens served. Pure: `llmgw plan --simulate` and
`plan --suggest` hand it the replay's outcomes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmgw.core.capacity.bench import percentile
from llmgw.core.config.specs.serving.slo_spec import OBJECTIVES
from llmgw.core.desired.catalog import Catalog
from llmgw.core.suggest.build import price_of

__all__ = ["Served", "SloRow", "fleet_cost", "render_costs", "render_slos", "slo_rows"]


@dataclass(frozen=True, slots=True)
class Served:
    """One replayed request: what its client saw."""

    model: str
    project: str
    tokens: int  # prompt and completion
    ttft_ms: float | None
    tpot_ms: float | None
    refused: bool


@dataclass(frozen=True, slots=True)
class SloRow:
    model: str
    project: str
    objective: str
    target: float
    figure: float | None  # None: the replay has nothing to say (no request served)
    met: bool | None  # None: not checked


def _figure(objective: str, rows: Sequence[Served]) -> float | None:
    if objective == "availability":
        return sum(not r.refused for r in rows) / len(rows) if rows else None
    if objective == "tpot_p99_ms":
        return percentile([r.tpot_ms for r in rows if r.tpot_ms is not None], 0.99)
    q = 0.9 if objective == "ttft_p90_ms" else 0.99
    return percentile([r.ttft_ms for r in rows if r.ttft_ms is not None], q)


def slo_rows(catalog: Catalog, served: Iterable[Served]) -> list[SloRow]:
    """Each declared objective of each model and project the replay served, with the replay's figure."""
    groups: dict[tuple[str, str], list[Served]] = {}
    for r in served:
        groups.setdefault((r.model, r.project), []).append(r)
    out = []
    for (model, project), rows in sorted(groups.items()):
        entry = catalog.models.get(model)
        slo = entry.spec.slo if entry is not None else None
        targets = slo.for_project(project) if slo is not None else {}
        for objective in OBJECTIVES:
            if objective not in targets:
                continue
            target, figure = targets[objective], _figure(objective, rows)
            met = (
                None
                if figure is None
                else (figure >= target if objective == "availability" else figure <= target)
            )
            out.append(SloRow(model, project, objective, target, figure, met))
    return out


def fleet_cost(catalog: Catalog, replicas: Iterable[tuple[str, str]]) -> tuple[float | None, list[str]]:
    """What the replicas (model, profile) cost per hour; None with the unpriced ones named when any is."""
    total, unknown = 0.0, []
    for model, name in replicas:
        entry = catalog.models.get(model)
        profile = (
            next((p for p in entry.spec.profiles if p.name == name), None) if entry is not None else None
        )
        price = price_of(profile, catalog.cluster.costs)[0] if profile is not None else None
        if price is None:
            unknown.append(f"{model}/{name}")
        else:
            total += price
    return (None if unknown else total), sorted(set(unknown))


def render_costs(
    label: str,
    catalog: Catalog,
    replicas: Sequence[tuple[str, str]],
    served: Sequence[Served],
    seconds: float,
) -> str:
    """`current fleet: 12.40 USD/h, 0.83 USD per million tokens (4 replicas)` (or why it is unknown)."""
    cost, unknown = fleet_cost(catalog, replicas)
    currency = catalog.cluster.costs.currency
    if cost is None:
        return f"{label}: cost unknown: no price for {', '.join(unknown)} (the Cluster's costs)"
    tokens_per_hour = sum(r.tokens for r in served if not r.refused) * 3600.0 / max(seconds, 1.0)
    per_million = (
        f", {cost / tokens_per_hour * 1e6:.3g} {currency} per million tokens" if tokens_per_hour else ""
    )
    return f"{label}: {cost:.2f} {currency}/h{per_million} ({len(replicas)} replicas)"


def render_slos(rows: Sequence[SloRow]) -> list[str]:
    """One line per objective: `chat (search) ttft_p99_ms 640 <= 800 met`."""
    out = []
    for r in rows:
        figure = "-" if r.figure is None else f"{r.figure:.4g}"
        verdict = {True: "met", False: "MISSED", None: "not checked (nothing served)"}[r.met]
        sign = ">=" if r.objective == "availability" else "<="
        out.append(f"  {r.model} ({r.project}) {r.objective} {figure} {sign} {r.target:g}: {verdict}")
    return out
