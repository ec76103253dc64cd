"""From the repo, its measurements and the live fleet to the search's problem: each model's profiles with their
engine models, prices and the objectives per traffic class; the limits the fleet sets; and, in words, where
each figure came from and what could not be checked. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmgw.core.capacity.engine_model import EngineModel, fit_engine_model
from llmgw.core.config.models import Profile
from llmgw.core.config.specs.serving.cost_spec import CPU_KIND_LABEL, DEFAULT_CPU_KIND, Costs
from llmgw.core.desired.catalog import Catalog
from llmgw.core.fleet.views import LiveState
from llmgw.core.placement.quota import profile_need
from llmgw.core.suggest.demand import Demand
from llmgw.core.suggest.evaluate import Estimate, needed, pool_rows
from llmgw.core.suggest.space import Choice, Limits, Problem, options_for
from llmgw.core.words import parse_duration

__all__ = [
    "NOT_CHECKED",
    "Built",
    "build_problem",
    "engine_source",
    "fleet_limits",
    "pool_figures",
    "price_of",
    "resource_of",
]

Measurements = Mapping[tuple[str, str], Mapping[str, Any] | None]

# What the evaluator cannot see, said with every suggestion.
NOT_CHECKED = (
    "availability counts refusals only: node failures and restarts are not modelled",
    "the autoscaler is taken to follow each hour's load at once: its lag and idle_timeout are not modelled",
    "GPUs are checked per class in total, not how they pack onto nodes (`llmgw plan` places them)",
    "a model's replicas run one profile: placement takes profiles in order, so no mix within a model is searched",
    "routing policies and the prefix cache are taken as they are (the replay runs the model's own policy)",
)


@dataclass
class Built:
    problem: Problem
    provenance: list[str] = field(default_factory=list)  # where each profile's figures came from
    unchecked: list[str] = field(default_factory=list)  # objectives and limits that could not be checked


def resource_of(profile: Profile) -> tuple[str, int]:
    """(what a replica holds: its GPU class or `cpu:<kind>`, how many of it)."""
    if profile.gpu_class is not None:
        _, held = profile_need(profile)
        return profile.gpu_class, max(1, held.gpus)
    return f"cpu:{profile.node_selector.get(CPU_KIND_LABEL, DEFAULT_CPU_KIND)}", profile.nodes


def price_of(profile: Profile, costs: Costs) -> tuple[float | None, str]:
    """One replica's price per hour and which price it is (None: no price declared)."""
    resource, units = resource_of(profile)
    if profile.gpu_class is not None:
        each = costs.gpu_price(profile.gpu_class)
        named = profile.gpu_class in costs.gpu_per_hour
        source = f"costs.gpu_per_hour.{profile.gpu_class}" if named else "costs.default_gpu_per_hour"
    else:
        kind = resource.removeprefix("cpu:")
        each = costs.cpu_price(kind)
        source = (
            f"costs.cpu_node_per_hour.{kind}"
            if kind in costs.cpu_node_per_hour
            else "costs.default_cpu_node_per_hour"
        )
    return (None if each is None else each * units), f"{source} x {units}"


def engine_source(engine: EngineModel) -> str:
    """Where a profile's engine figures come from, in words."""
    if not engine.measured:
        return "assumption: " + "; ".join(engine.assumptions)
    if engine.assumptions:
        return "fit estimate from its bench: " + "; ".join(engine.assumptions)
    return "bench on this profile (`llmgw bench --save`)"


def fleet_limits(catalog: Catalog, live: LiveState | None) -> tuple[Limits, list[str]]:
    """GPUs per class the live nodes report (cordoned ones left out), CPU nodes per kind, and the quotas' GPU
    limits; with what could not be known."""
    resources: dict[str, int] = {}
    notes: list[str] = []
    nodes = [n for n in (live.nodes if live is not None else []) if not n.cordoned]
    for node in nodes:
        if node.gpus:
            for gpu in node.gpus:
                if gpu.gpu_class is not None:
                    resources[gpu.gpu_class] = resources.get(gpu.gpu_class, 0) + 1
        elif node.gpus is not None:
            kind = f"cpu:{node.labels.get(CPU_KIND_LABEL, DEFAULT_CPU_KIND)}"
            resources[kind] = resources.get(kind, 0) + 1
    if not nodes:
        notes.append(
            "no live nodes: GPUs per class and CPU nodes are not checked (give --state or a controller)"
        )
    quotas: dict[tuple[str, str], int] = {}
    for entry in catalog.models.values():
        for scope in catalog.quota_scopes(entry.spec.owner):
            for cls, gpus in scope.gpus.items():
                quotas[(scope.name, cls)] = gpus
    return Limits(resources, quotas), notes


def _choice(
    catalog: Catalog,
    model: str,
    profile: Profile,
    engine: EngineModel,
    demands: Sequence[Demand],
    most: int,
) -> Choice:
    spec = catalog.models[model].spec
    timeout = parse_duration(catalog.cluster.router.admission.timeout)
    targets = {
        c.project: (spec.slo.for_project(c.project) if spec.slo is not None else {})
        for d in demands
        for c in d.classes
    }
    slots = profile.slots or engine.capacity
    table = {d.period: pool_rows(engine, slots, d, most, timeout) for d in demands}
    price, source = price_of(profile, catalog.cluster.costs)
    resource, units = resource_of(profile)
    return Choice(
        model,
        profile.name,
        resource,
        units,
        price or 0.0,
        source,
        engine_source(engine),
        tuple(needed(p, rows, targets) for p, rows in sorted(table.items())),
        tuple(s.name for s in catalog.quota_scopes(spec.owner)) if profile.gpu_class is not None else (),
        table,
        spec.slo.ttft_p99_ms if spec.slo is not None else None,
        targets,
    )


def _searchable(catalog: Catalog, model: str, built: Built) -> list[Profile]:
    entry = catalog.models.get(model)
    if entry is None:
        built.unchecked.append(f"{model}: in the trace but not in the repo: left out")
        return []
    if entry.spec.provider is not None:
        built.unchecked.append(f"{model}: served by a provider: nothing to size")
        return []
    if entry.spec.slo is None:
        built.unchecked.append(f"{model}: declares no slo: held only to keeping up with its load")
    out = []
    for profile in entry.spec.profiles:
        price, source = price_of(profile, catalog.cluster.costs)
        if profile.role != "both":
            built.unchecked.append(f"{model}/{profile.name}: a disaggregated pool's profile: not searched")
        elif price is None:
            built.unchecked.append(f"{model}/{profile.name}: no price ({source}): left out of the search")
        else:
            out.append(profile)
    return out


def build_problem(
    catalog: Catalog,
    demand: Mapping[str, Sequence[Demand]],
    periods: int,
    measured: Measurements,
    limits: Limits,
    most: int,
) -> Built:
    """The problem for the models the demand names, with `most` replicas the most searched per model."""
    built = Built(Problem({}, limits, periods), unchecked=[])
    options = {}
    for model in sorted(demand):
        choices = []
        for profile in _searchable(catalog, model, built):
            where = f"{model}/{profile.name}"
            engine = fit_engine_model(measured.get((model, profile.name)), profile.slots, where)
            choice = _choice(catalog, model, profile, engine, demand[model], most)
            built.provenance.append(
                f"{where}: {choice.engine_source}; {choice.price_per_hour:g}/h from {choice.price_source}"
            )
            choices.append(choice)
        if choices:
            options[model] = options_for(choices, most, periods)
    built.problem = Problem(options, limits, periods)
    return built


def pool_figures(choice: Choice, period: int, replicas: int) -> Mapping[str, Estimate]:
    """The estimates for one period's pool (empty when the model has no demand then)."""
    rows = choice.table.get(period)
    return rows[min(replicas, len(rows)) - 1] if rows and replicas >= 1 else {}
