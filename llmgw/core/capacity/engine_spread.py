"""An engine model with its spread: the pooled fit and one model per pass of `llmgw bench --repeats`.

A bench of R passes stores, beside each pooled step (every pass's requests of that step together, what
`fit_engine_model` reads), each pass's own share of it (`repeat` = 1..R). Each pass is a whole measurement
of its own, taken minutes apart from the others, and what differs between them is the engine's speed while
it was measured: a busier machine slows prefill and decode at once. A pass's model is the pooled fit at that
pass's speed: its prefill costs times the pass's prefill factor, its gaps times its decode factor, each
factor the median over the pass's steps of its figure over the pooled step's (the concurrency-1 TTFTs for
prefill, the ladder's mean gaps for decode; the medians let one stalled step of four not move the pass).
Fitting each pass's seven parameters afresh from its four short steps was tried first: on llama.cpp the fits
swung from zero to several times the pooled value (prefill fixed cost over [0, 354] ms) while the pass's
figures moved by a tenth, so the spread described the fit, not the engine.

So a parameter's interval is over the passes' models (`mean_interval`), and the replay runs once per pass's
model (`llmgw.core.capacity.replay_spread`): the joint spread, with no guess at how the parameters correlate
and no assumption that the replay is monotone in them. The shares (exclusive, contention) are the pooled
fit's in every pass: a speed moves costs, not how they overlap.

A measurement without passes (an older bench, or `--repeats 1`) has no spread: its figures are points, and
the plan says the spread is unknown rather than zero.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from llmgw.core.capacity.engine_model import EngineModel, fit_engine_model
from llmgw.core.capacity.spread import Interval, mean_interval

__all__ = [
    "PARAMETERS",
    "EngineSpread",
    "at_pass_speed",
    "at_speed",
    "fit_engine_spread",
    "parameters_of",
    "pass_curves",
]

# What the bench fits, by the name it prints: (words, unit).
PARAMETERS = {
    "prefill_fixed_ms": ("prefill fixed cost", "ms"),
    "prefill_ms_per_token": ("prefill per token", "ms"),
    "prefill_us_per_token_sq": ("prefill per token squared", "us"),
    "decode_ms_per_token": ("decode per token (alone)", "ms"),
    "decode_ms_per_token_top": ("decode per token (top step)", "ms"),
    "exclusive": ("exclusive share", ""),
    "contention": ("contention per other in flight", ""),
}


@dataclass(frozen=True)
class EngineSpread:
    """The pooled model (`central`, what a replay without spread uses), each pass's model, and each
    parameter's interval over the passes (empty without passes)."""

    central: EngineModel
    passes: tuple[EngineModel, ...]
    parameters: Mapping[str, Interval]

    @property
    def known(self) -> bool:
        """Two passes at least: a spread was measured."""
        return len(self.passes) >= 2


def pass_curves(curve: Sequence[Mapping[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Each pass's steps (by its `repeat`), with `repeat` taken off so a fit reads them as a whole curve."""
    out: dict[int, list[dict[str, Any]]] = {}
    for step in curve:
        k = step.get("repeat")
        if isinstance(k, int):
            out.setdefault(k, []).append({key: v for key, v in step.items() if key != "repeat"})
    return dict(sorted(out.items()))


def parameters_of(model: EngineModel) -> dict[str, float]:
    """The model's fitted parameters by PARAMETERS' names."""
    return {
        "prefill_fixed_ms": model.fixed_ms,
        "prefill_ms_per_token": model.prefill_ms_per_token,
        "prefill_us_per_token_sq": model.prefill_ms_per_token_sq * 1000.0,
        "decode_ms_per_token": model.itl(1),
        "decode_ms_per_token_top": model.itl(int(model.itl_ms[-1][0])),
        "exclusive": model.exclusive,
        "contention": model.contention,
    }


def fit_engine_spread(measured: Mapping[str, Any] | None, slots: int | None, where: str) -> EngineSpread:
    """The pooled fit (exactly `fit_engine_model`'s) and, where the measurement has passes, the pooled fit at
    each pass's speed, and every parameter's interval over them."""
    central = fit_engine_model(measured, slots, where)
    if measured is None or not central.measured:
        return EngineSpread(central, (), {})
    curve = measured.get("curve") or []
    pooled = [s for s in curve if s.get("repeat") is None]
    passes = []
    for steps in pass_curves(curve).values():
        one = at_pass_speed(central, pooled, steps)
        if one is not None:
            passes.append(one)
    if len(passes) < 2:
        return EngineSpread(central, (), {})
    values = [parameters_of(m) for m in passes]
    intervals = {name: _within(name, mean_interval([v[name] for v in values])) for name in PARAMETERS}
    return EngineSpread(central, tuple(passes), intervals)


def at_pass_speed(
    central: EngineModel, pooled: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]
) -> EngineModel | None:
    """The pooled model at one pass's speed (see the module's words); None when the pass has no TTFT step
    beside a pooled one (nothing to tell its speed by)."""
    prefill = _median_ratio(pooled, steps, "ttft_p50_ms", _alone)
    if prefill is None:
        return None
    decode = _median_ratio(pooled, steps, "itl_mean_ms", _on_ladder) or _median_ratio(
        pooled, steps, "itl_p50_ms", _on_ladder
    )
    return at_speed(central, prefill, prefill if decode is None else decode)


def at_speed(model: EngineModel, prefill: float, gap: float) -> EngineModel:
    """The model with its prefill costs times `prefill` and its gaps between tokens times `gap` (above 1:
    slower); the shares stay: a speed moves costs, not how they overlap."""
    return replace(
        model,
        fixed_ms=model.fixed_ms * prefill,
        prefill_ms_per_token=model.prefill_ms_per_token * prefill,
        prefill_ms_per_token_sq=model.prefill_ms_per_token_sq * prefill,
        itl_ms=tuple((at, ms * gap) for at, ms in model.itl_ms),
    )


def _pooled_step(pooled: Sequence[Mapping[str, Any]], step: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pooled step a pass's step is a share of: the same concurrency and role, the nearest prompt length
    (the short and long probes are concurrency-1 steps too, and a pass may count its prompts a token apart)."""
    same = [
        s
        for s in pooled
        if s.get("concurrency") == step.get("concurrency")
        and (s.get("role") or "ladder") == (step.get("role") or "ladder")
    ]
    return min(same, key=lambda s: abs(_tokens(s) - _tokens(step)), default=None)


def _tokens(step: Mapping[str, Any]) -> float:
    n = step.get("prompt_tokens")
    return float(n) if isinstance(n, int | float) else 0.0


def _alone(step: Mapping[str, Any]) -> bool:
    """A concurrency-1 step: what the prefill's costs are fitted from."""
    return step.get("concurrency") == 1


def _on_ladder(step: Mapping[str, Any]) -> bool:
    """A step of the concurrency ladder (not a prompt-length probe): what the gaps are fitted from."""
    return (step.get("role") or "ladder") == "ladder"


def _median_ratio(
    pooled: Sequence[Mapping[str, Any]],
    steps: Sequence[Mapping[str, Any]],
    key: str,
    counts: Callable[[Mapping[str, Any]], bool],
) -> float | None:
    """The median, over the pass's steps that `counts`, of the pass's `key` over the pooled step's it is a share
    of; None when no step has both."""
    ratios = []
    for step in steps:
        base = _pooled_step(pooled, step)
        mine, theirs = step.get(key), base.get(key) if base is not None else None
        if counts(step) and isinstance(mine, int | float) and isinstance(theirs, int | float) and theirs > 0:
            ratios.append(float(mine) / float(theirs))
    return statistics.median(ratios) if ratios else None


def _within(name: str, i: Interval) -> Interval:
    """The interval kept to what the parameter can be: no cost below 0, no share above 1 (t's symmetric
    interval over three passes can reach past both)."""
    high = min(i.high, 1.0) if name == "exclusive" else i.high
    return Interval(max(0.0, i.low), i.mid, high, i.n)
