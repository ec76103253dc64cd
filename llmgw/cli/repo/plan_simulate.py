"""`llmgw plan --simulate`: replay a trace against the current and the planned fleet, in virtual time.

The current fleet is the live state's replicas that serve or are about to (not draining, stopping, stopped or
failed); the planned fleet is that minus the plan's stops, plus its starts (a restart keeps its place). Each
replica's engine model is fitted from what `llmgw bench --save` measured for its model and profile
(`GET /api/v1/capacity`, or `--capacity FILE` saved from `llmgw capacity --json` for CI without the cluster);
what nobody measured is assumed and printed. Both fleets replay the same trace with the same seed, through
`llmgw_router.decisions.replay` (the router's own scheduler and fair queue), and `llmgw.core.capacity.replay_gate` judges.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from llmgw_router.decisions.replay import ModelOutcome, Replay, SimFleet, SimReplica, replay

from llmgw.cli.repo.plan_spread import assess, figures_of
from llmgw.core.capacity.engine_model import EngineModel, fit_engine_model
from llmgw.core.capacity.replay_gate import Figures, regressions, render_text
from llmgw.core.config.models import ModelSpec
from llmgw.core.desired.catalog import Catalog
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.states import ACTIVE_STATES
from llmgw.core.fleet.views import LiveState, class_rank
from llmgw.core.plan import Plan
from llmgw.core.suggest.served import Served, render_costs, render_slos, slo_rows
from llmgw.core.traffic.synthetic_trace import DEFAULT_LOAD, DEFAULT_MINUTES, Shape, steady
from llmgw.core.traffic.trace import Trace, TracedRequest, TraceError, parse_trace
from llmgw.core.words import parse_duration

__all__ = [
    "EngineModels",
    "SimulateError",
    "Simulated",
    "fetch_measurements",
    "read_capacity_file",
    "served",
    "sim_fleet",
    "simulate",
    "synthetic",
]

Measurements = Mapping[tuple[str, str], Mapping[str, Any] | None]  # (model, profile) -> `measured` or None


class SimulateError(LlmgwError):
    """The simulation cannot run: a trace or capacity file that cannot be read."""


@dataclass(frozen=True)
class Simulated:
    text: str
    regressions: tuple[str, ...]
    undecided: tuple[str, ...] = ()  # verdicts whose interval straddles a threshold (plan_spread)


def measurements(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any] | None]:
    """`GET /api/v1/capacity`'s rows by model and profile."""
    return {(str(r["model"]), str(r["profile"])): r.get("measured") for r in rows}


def read_capacity_file(path: Path) -> dict[tuple[str, str], Mapping[str, Any] | None]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data["capacity"]
        return measurements(rows)
    except OSError as exc:
        raise SimulateError(f"--capacity {path}: cannot read it: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise SimulateError(
            f'--capacity {path}: not the output of `llmgw capacity --json` ({{"capacity": [...]}}): {exc}'
        ) from exc


def fetch_measurements(capacity: Path | None, client: Any) -> dict[tuple[str, str], Mapping[str, Any] | None]:
    """What `llmgw bench --save` stored: from `--capacity FILE`, else the controller's (none without one)."""
    if capacity is not None:
        return read_capacity_file(capacity)
    if client is not None:
        return measurements(client.get("/api/v1/capacity").get("capacity", []))
    return {}


def read_trace(path: Path) -> Trace:
    try:
        with path.open(encoding="utf-8") as fh:
            return parse_trace(fh)
    except OSError as exc:
        raise SimulateError(f"trace {path}: cannot read it: {exc.strerror or exc}") from exc
    except TraceError as exc:
        raise SimulateError(f"trace {path}: {exc}") from exc


class EngineModels:
    """Engine models per (model, profile), fitted once, with every assumption said once."""

    def __init__(self, measured: Measurements) -> None:
        self.measured = measured
        self.cache: dict[tuple[str, str, int | None], EngineModel] = {}
        self.assumptions: list[str] = []

    def get(self, model: str, profile: str, slots: int | None) -> EngineModel:
        key = (model, profile, slots)
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = fit_engine_model(
                self.measured.get((model, profile)), slots, f"{model}/{profile}"
            )
            self.assumptions.extend(a for a in found.assumptions if a not in self.assumptions)
        return found


class ModelSource(Protocol):
    def get(self, model: str, profile: str, slots: int | None) -> EngineModel: ...


def _slots(specs: Mapping[str, ModelSpec], model: str, profile: str) -> int | None:
    spec = specs.get(model)
    found = next((p for p in spec.profiles if p.name == profile), None) if spec is not None else None
    return found.slots if found is not None else None


def _fleets(live: LiveState, made: Plan) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    current = [(r.id, r.model, r.profile) for r in live.replicas if r.state in ACTIVE_STATES]
    stopped = {s.replica_id for s in made.stops}
    planned = [r for r in current if r[0] not in stopped]
    planned += [(s.replica_id, s.model, s.profile) for s in made.starts]
    return current, planned


def sim_fleet(
    catalog: Catalog,
    replicas: list[tuple[str, str, str]],
    specs: Mapping[str, ModelSpec],
    models: ModelSource,
) -> SimFleet:
    admission = catalog.cluster.router.admission
    names = {m for _, m, _ in replicas} | set(catalog.models)
    sims = tuple(
        SimReplica(rid, model, models.get(model, profile, slots), slots)
        for rid, model, profile in replicas
        for slots in (_slots(specs, model, profile),)
    )
    ranks = {
        name: class_rank(catalog.cluster.classes, entry.spec.model_class)
        for name, entry in catalog.models.items()
    }
    projects = {name: (p.priority, p.share) for name, p in catalog.tenants().projects.items()}
    return SimFleet(
        replicas=sims,
        policies={m: catalog.policy_for(m) for m in names if m in catalog.models},
        queue_size=admission.queue_size,
        model_queue_size=admission.model_queue_size,
        queue_timeout_s=parse_duration(admission.timeout),
        class_ranks=ranks,
        projects=projects,
    )


def synthetic(fleet: SimFleet, other: SimFleet, seed: int) -> tuple[list[TracedRequest], str]:
    """DEFAULT_LOAD of what the current fleet completes per second per model (the planned fleet's for a
    model only it serves), for DEFAULT_MINUTES (llmgw.core.traffic.synthetic_trace)."""
    shape = Shape()
    rates: dict[str, float] = {}
    for source in (other, fleet):  # the current fleet's figure wins
        per: dict[str, float] = {}
        for r in source.replicas:
            per[r.model] = per.get(r.model, 0.0) + r.engine.requests_per_s(
                shape.prompt_tokens, shape.completion_tokens
            )
        rates.update({m: DEFAULT_LOAD * v for m, v in per.items()})
    _, requests = steady(rates, DEFAULT_MINUTES * 60.0, random.Random(seed), shape)
    words = (
        f"a synthetic trace: {DEFAULT_LOAD:.0%} of the current fleet's modelled capacity per model for "
        f"{DEFAULT_MINUTES:g} minutes, {shape.prompt_tokens} prompt and ~{shape.completion_tokens} completion "
        f"tokens per request, {len(requests)} requests"
    )
    return requests, words


def _figures(outcomes: Mapping[str, ModelOutcome]) -> dict[str, Figures]:
    return figures_of(outcomes)


def simulate(
    catalog: Catalog,
    live: LiveState,
    made: Plan,
    trace_path: Path | None,
    measured: Measurements,
    *,
    seed: int = 0,
) -> Simulated:
    """Replay the trace (a synthetic one without `trace_path`) against both fleets; the section's text and
    the regressions past the Cluster's thresholds."""
    models = EngineModels(measured)
    current_replicas, planned_replicas = _fleets(live, made)
    planned_specs = {name: entry.spec for name, entry in catalog.models.items()}
    current_specs = live.models if live.models is not None else planned_specs
    current = sim_fleet(catalog, current_replicas, current_specs, models)
    planned = sim_fleet(catalog, planned_replicas, planned_specs, models)
    notes: list[str] = []
    duration: float | None
    if trace_path is None:
        requests, source = synthetic(current, planned, seed)
        duration = DEFAULT_MINUTES * 60.0
    else:
        trace = read_trace(trace_path)
        requests, duration = list(trace.requests), trace.header.duration_s or None
        source = f"trace {trace_path}: {len(requests)} requests"
        notes.extend(f"trace {trace_path}: {s} (skipped)" for s in trace.skipped)
    now_run = replay(current, requests, seed=seed, duration_s=duration)
    then_run = replay(planned, requests, seed=seed, duration_s=duration)
    now, then = _figures(now_run.models), _figures(then_run.models)
    limits = catalog.cluster.plan.simulate
    seconds = duration or (requests[-1].t if requests else 1.0)
    runs = ((current_replicas, now_run, "current"), (planned_replicas, then_run, "planned"))
    serving = _serving(catalog, requests, runs, seconds)

    def build(source: ModelSource | None, is_planned: bool) -> SimFleet:
        if source is None:
            return planned if is_planned else current
        if is_planned:
            return sim_fleet(catalog, planned_replicas, planned_specs, source)
        return sim_fleet(catalog, current_replicas, current_specs, source)

    slos = {name: e.spec.slo.ttft_p99_ms for name, e in catalog.models.items() if e.spec.slo is not None}
    spread = assess(
        build, measured, list(models.cache), requests, duration, seed, limits, slos, (now_run, then_run)
    )
    if spread is None:
        found = regressions(now, then, limits)
        text = render_text(source, now, then, found, [*notes, *models.assumptions])
        return Simulated(text + serving, tuple(found))
    text = render_text(
        source,
        now,
        then,
        spread.regressions,
        [*notes, *models.assumptions],
        extra=spread.lines,
        undecided=spread.undecided,
    )
    return Simulated(text + serving, spread.regressions, spread.undecided)


def served(requests: Sequence[TracedRequest], run: Replay) -> list[Served]:
    """The replay's outcomes as `llmgw.core.suggest.served` reads them."""
    return [
        Served(
            r.model,
            r.project,
            r.prompt_tokens + r.completion_tokens,
            o.ttft_ms,
            o.tpot_ms,
            o.refused is not None,
        )
        for r, o in zip(requests, run.outcomes, strict=True)
    ]


def _serving(
    catalog: Catalog,
    requests: Sequence[TracedRequest],
    runs: Iterable[tuple[Sequence[tuple[str, str, str]], Replay, str]],
    seconds: float,
) -> str:
    """The fleets' costs (once the Cluster prices anything) and the planned fleet's objectives, in the replay."""
    lines: list[str] = []
    for replicas, run, label in runs:
        outcomes = served(requests, run)
        if catalog.cluster.costs.declared:
            pairs = [(m, p) for _, m, p in replicas]
            lines.append(render_costs(f"Cost of the {label} fleet", catalog, pairs, outcomes, seconds))
        if label == "planned" and (rows := slo_rows(catalog, outcomes)):
            lines.append("Objectives on the planned fleet (replay; docs/gitops.md, Suggested fleets):")
            lines.extend(render_slos(rows))
    return "\n".join(lines) + "\n" if lines else ""
