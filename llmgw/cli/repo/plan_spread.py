"""`plan --simulate`'s intervals: the replay once more per bench pass, and the verdicts the spread allows.

Where the measurements the plan reads were taken with `llmgw bench --repeats R` (R >= 2), each pass's model
(`llmgw.core.capacity.engine_spread`: the pooled fit at the pass's speed) replays the same trace against both fleets with the same seed; the
figures' intervals, the undecided verdicts and the warning near capacity are
`llmgw.core.capacity.replay_spread`'s. A profile measured with fewer passes than another uses its pooled fit
for the passes it lacks (its share of the spread is then unknown, and said). Without any passes nothing runs
here: the plan's figures are points, as before. With them, two replays more: the pooled fits slower and faster by
the model's own error (MODEL_SLOWER, MODEL_FASTER), which every interval covers too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmgw_router.decisions.replay import ModelOutcome, Replay, SimFleet, replay

from llmgw.core.capacity.engine_model import EngineModel
from llmgw.core.capacity.engine_spread import EngineSpread, at_speed, fit_engine_spread
from llmgw.core.capacity.replay_gate import Figures, percent
from llmgw.core.capacity.replay_spread import (
    MODEL_BOUNDS,
    Spread,
    cliff_words,
    figure_spread,
    judge_ratio,
    judge_slo,
    offered_load,
    spread_section,
)
from llmgw.core.config.models import SimulateSettings
from llmgw.core.traffic.trace import TracedRequest

__all__ = ["SpreadResult", "assess", "figures_of"]

Key = tuple[str, str, int | None]  # (model, profile, declared slots)
Measurements = Mapping[tuple[str, str], Mapping[str, object] | None]


def figures_of(outcomes: Mapping[str, ModelOutcome]) -> dict[str, Figures]:
    return {
        m: Figures(m, o.requests, o.served, dict(o.refused), o.ttft_p50_ms, o.ttft_p99_ms, o.utilization)
        for m, o in outcomes.items()
        if o.requests
    }


class PassModels:
    """The engine models of one bench pass (`k`), by the getter `sim_fleet` asks; a profile with fewer
    passes answers with its pooled fit."""

    def __init__(self, spreads: Mapping[Key, EngineSpread], k: int) -> None:
        self.spreads, self.k = spreads, k

    def get(self, model: str, profile: str, slots: int | None) -> EngineModel:
        spread = self.spreads[(model, profile, slots)]
        return spread.passes[self.k] if self.k < len(spread.passes) else spread.central


class BoundModels:
    """The pooled fits at one bound of the model's own error: every cost times `factor` (one of MODEL_BOUNDS,
    `llmgw.core.capacity.replay_spread`); an unmeasured profile's stated defaults as they are."""

    def __init__(self, spreads: Mapping[Key, EngineSpread], factor: float) -> None:
        self.spreads, self.factor = spreads, factor

    def get(self, model: str, profile: str, slots: int | None) -> EngineModel:
        central = self.spreads[(model, profile, slots)].central
        return at_speed(central, self.factor, self.factor) if central.measured else central


Models = PassModels | BoundModels  # what a replay other than the pooled one builds its fleet with


@dataclass(frozen=True)
class SpreadResult:
    lines: tuple[str, ...]
    regressions: tuple[str, ...]  # the whole interval past a threshold
    undecided: tuple[str, ...]  # the interval straddles it


@dataclass(frozen=True)
class Run:
    """One fleet's replays: the pooled one and one per pass."""

    central: Mapping[str, Figures]
    passes: Sequence[Mapping[str, Figures]]
    loads: Mapping[str, tuple[float, float]]
    pass_loads: Sequence[Mapping[str, tuple[float, float]]]
    replicas: Mapping[str, int]
    ttfts: Mapping[str, list[float]]  # the pooled replay's, per model: its percentiles' sampling
    bounds: Sequence[Mapping[str, Figures]]  # slower and faster by the model's own error


def _engines(fleet: SimFleet) -> dict[str, list[EngineModel]]:
    out: dict[str, list[EngineModel]] = {}
    for r in fleet.replicas:
        out.setdefault(r.model, []).append(r.engine)
    return out


def _spreads(run: Run) -> dict[str, Spread]:
    out = {}
    for model, central in run.central.items():
        load = run.loads.get(model)
        out[model] = figure_spread(
            central,
            [p.get(model) for p in run.passes],
            load[1] if load else None,
            [p[model][1] if model in p else None for p in run.pass_loads],
            run.ttfts.get(model, ()),
            [b.get(model) for b in run.bounds],
        )
    return out


def _verdicts(
    now: Run, then: Run, limits: SimulateSettings
) -> tuple[list[str], list[str], list[str]]:  # (regressions, undecided, within)
    failed: list[str] = []
    undecided: list[str] = []
    within: list[str] = []
    max_p99, max_refused = percent(limits.max_p99_ttft_increase), percent(limits.max_refusals_increase)
    for model, after in sorted(then.central.items()):
        before = now.central.get(model)
        if before is not None and before.ttft_p99_ms is not None and after.ttft_p99_ms is not None:
            pairs = [_pair(n.get(model), t.get(model)) for n, t in zip(now.passes, then.passes, strict=True)]
            verdict = judge_ratio(model, (before.ttft_p99_ms, after.ttft_p99_ms), pairs, max_p99)
            {"fail": failed, "undecided": undecided, "pass": within}[verdict.state].append(verdict.words)
        flags = [
            _refusals_up(n.get(model), t.get(model), max_refused)
            for n, t in [(now.central, then.central), *zip(now.passes, then.passes, strict=True)]
        ]
        if any(flags):
            words = (
                f"model {model}: refusals rise past spec.plan.simulate.max_refusals_increase "
                f"({limits.max_refusals_increase}) in {sum(flags)} of {len(flags)} replays"
            )
            (failed if all(flags) else undecided).append(words)
    return failed, undecided, within


def _pair(now: Figures | None, then: Figures | None) -> tuple[float, float] | None:
    if now is None or then is None or now.ttft_p99_ms is None or then.ttft_p99_ms is None:
        return None
    return now.ttft_p99_ms, then.ttft_p99_ms


def _refusals_up(now: Figures | None, then: Figures | None, limit: float) -> bool:
    if then is None or not then.requests:
        return False
    return then.refused_share - (now.refused_share if now is not None else 0.0) > limit


def _notes(spreads: Mapping[str, Spread], run: Run, slos: Mapping[str, float], label: str) -> list[str]:
    out = []
    for model, s in sorted(spreads.items()):
        if model in slos and s.p99 is not None:
            out.append(f"  {label}: " + judge_slo(model, s.p99, slos[model]).words)
        rate = run.loads[model][0] if model in run.loads else 0.0
        cliff = cliff_words(s, run.replicas.get(model, 0), rate)
        if cliff is not None:
            out.append(f"  {label}: {cliff}")
    return out


def _ttfts(replayed: Replay) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for o in replayed.outcomes:
        if o.ttft_ms is not None:
            out.setdefault(o.model, []).append(o.ttft_ms)
    return out


def _run(
    build: Callable[[Models | None], SimFleet],
    pooled: Replay,
    spreads: Mapping[Key, EngineSpread],
    passes: int,
    replayed: Callable[[SimFleet], Mapping[str, Figures]],
    load_of: Callable[[SimFleet], dict[str, tuple[float, float]]],
) -> Run:
    central = build(None)
    fleets = [build(PassModels(spreads, k)) for k in range(passes)]
    replicas: dict[str, int] = {}
    for r in central.replicas:
        replicas[r.model] = replicas.get(r.model, 0) + 1
    return Run(
        figures_of(pooled.models),
        [replayed(f) for f in fleets],
        load_of(central),
        [load_of(f) for f in fleets],
        replicas,
        _ttfts(pooled),
        [replayed(build(BoundModels(spreads, factor))) for factor in MODEL_BOUNDS],
    )


def assess(
    build: Callable[[Models | None, bool], SimFleet],
    measured: Measurements,
    keys: Iterable[Key],
    requests: Sequence[TracedRequest],
    duration_s: float | None,
    seed: int,
    limits: SimulateSettings,
    slos: Mapping[str, float],
    central: tuple[Replay, Replay],
) -> SpreadResult | None:
    """The intervals and verdicts, or None where no measurement has two passes. `build(models, planned)`
    makes the current (False) or planned (True) fleet with those models (None: the pooled fits);
    `central`: the current and planned fleets replayed with the pooled fits."""
    spreads = {key: fit_engine_spread(measured.get(key[:2]), key[2], f"{key[0]}/{key[1]}") for key in keys}
    passes = max((len(s.passes) for s in spreads.values()), default=0)
    if passes < 2:
        return None

    def replayed(fleet: SimFleet) -> Mapping[str, Figures]:
        return figures_of(replay(fleet, requests, seed=seed, duration_s=duration_s).models)

    def load_of(fleet: SimFleet) -> dict[str, tuple[float, float]]:
        return offered_load(requests, duration_s, _engines(fleet))

    now = _run(lambda m: build(m, False), central[0], spreads, passes, replayed, load_of)
    then = _run(lambda m: build(m, True), central[1], spreads, passes, replayed, load_of)
    now_spread, then_spread = _spreads(now), _spreads(then)
    failed, undecided, within = _verdicts(now, then, limits)
    short = sorted(
        f"{k[0]}/{k[1]}" for k, s in spreads.items() if s.central.measured and len(s.passes) < passes
    )
    notes = [f"  {w}: fewer bench passes than {passes}: its spread is not known" for w in short]
    notes += [f"  within the threshold: {w}" for w in within]
    notes += _notes(now_spread, now, slos, "current") + _notes(then_spread, then, slos, "planned")
    lines = spread_section(now_spread, then_spread, passes, notes)
    return SpreadResult(tuple(lines), tuple(failed), tuple(undecided))
