"""An engine model with its spread: the pooled fit and one fit per pass of `llmgw bench --repeats`.

A bench of R passes stores, beside each pooled step (every pass's requests of that step together, what
`fit_engine_model` reads), each pass's own share of it (`repeat` = 1..R). Each pass is a whole measurement
of its own, taken minutes apart from the others: fitting each gives R engine models whose differences are
what the engine's speed did while it was measured, all parameters moving together as they really did (a
busier machine slows prefill and decode at once). So a parameter's interval is over the passes' fits
(`mean_interval`), and the replay runs once per pass's model (`llmgw.core.capacity.replay_spread`): the joint
spread, with no guess at how the parameters correlate and no assumption that the replay is monotone in them.

A measurement without passes (an older bench, or `--repeats 1`) has no spread: its figures are points, and
the plan says the spread is unknown rather than zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmgw.core.capacity.engine_model import EngineModel, fit_engine_model
from llmgw.core.capacity.spread import Interval, mean_interval

__all__ = [
    "PARAMETERS",
    "EngineSpread",
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
    """The pooled fit (exactly `fit_engine_model`'s) and, where the measurement has passes, one fit per pass
    at the same capacity, and every parameter's interval over them."""
    central = fit_engine_model(measured, slots, where)
    if measured is None or not central.measured:
        return EngineSpread(central, (), {})
    passes = []
    for steps in pass_curves(measured.get("curve") or []).values():
        one = fit_engine_model({**measured, "curve": steps}, slots or central.capacity, where)
        if one.measured:
            passes.append(one)
    if len(passes) < 2:
        return EngineSpread(central, (), {})
    values = [parameters_of(m) for m in passes]
    intervals = {name: _within(name, mean_interval([v[name] for v in values])) for name in PARAMETERS}
    return EngineSpread(central, tuple(passes), intervals)


def _within(name: str, i: Interval) -> Interval:
    """The interval kept to what the parameter can be: no cost below 0, no share above 1 (t's symmetric
    interval over three passes can reach past both)."""
    high = min(i.high, 1.0) if name == "exclusive" else i.high
    return Interval(max(0.0, i.low), i.mid, high, i.n)
