"""`plan --simulate`'s figures with their intervals, and the verdicts they allow. Pure: figures in, words out.

The replay runs once with the pooled engine models (the figure shown) and once per bench pass's models
(`llmgw.core.capacity.engine_spread`): several replays over the parameters' measured spread, not an analytic
bound, because the replay is a router's queue and scheduler, whose answer is not a formula of the parameters,
and because each pass's model keeps the parameters moving together as they did. From the passes' figures (each
over the pooled replay's, on the log scale) comes a prediction interval (`spread.prediction_interval`): where
the figure lands on a day the engine runs like one more pass, at CONFIDENCE.

The passes measure how the engine's speed moves; they cannot measure how far the model itself is from the
engine serving traffic rather than a bench. That is MODEL_SLOWER and MODEL_FASTER, stated, not measured per
plan: twice more the replay runs with every cost of the pooled models that much higher and lower
(`engine_spread.at_speed`), and every interval covers those figures too. Their values are what
benchmarks/replay_fidelity.py found on vLLM's CPU build (docs/gitops.md): read with vLLM's own timers, the
engine serving a trace was 6-13 % slower than the model of its bench (its time to first token, its decode, a
request's whole time in it), in every run; the model replaying the bench's own top step was 3-4 % slower than
the bench. Slower by a few per cent at 80 % of modelled capacity is a p50 TTFT of 837 ms against 474 predicted:
the queue in front of the engine multiplies it. The sim engine runs exactly as modelled; the bounds only widen.

Verdicts read the interval, not the point:
- a regression past a threshold is one when the whole interval of the planned-over-current ratio (both fleets
  replayed with the same pass's models, so the speed they share cancels) is past it; none when the whole
  interval is within; otherwise **undecided**, said as such, neither passed nor failed;
- an SLO (the model's `slo.ttft_p99_ms`) is met, missed or undecided the same way;
- near modelled capacity (the offered load over what the models complete) a small error in the engine's
  speed moves the queue most (an M/M/1 queue's wait grows by 1/(1-load) per unit of speed lost): where the p99's
  interval is wider than RELIABLE, the plan says the prediction is least reliable there and what load (and how
  many replicas) would bring the interval within it, for the passes' speed spread and MODEL_SLOWER together
  (independent, so in quadrature).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.core.capacity.engine_model import EngineModel
from llmgw.core.capacity.replay_gate import Figures
from llmgw.core.capacity.spread import CONFIDENCE, Interval, prediction_interval
from llmgw.core.traffic.trace import TracedRequest

__all__ = [
    "MODEL_BOUNDS",
    "MODEL_ERROR_WORDS",
    "MODEL_FASTER",
    "MODEL_SLOWER",
    "RELIABLE",
    "Spread",
    "Verdict",
    "cliff_words",
    "figure_interval",
    "figure_spread",
    "judge_ratio",
    "judge_slo",
    "offered_load",
    "quantile_interval",
    "reliable_load",
    "spread_of",
    "spread_section",
    "verdict_state",
    "widen",
]

RELIABLE = 0.35  # ±: the widest interval a reviewer can act on (the fidelity issue's target)
# The cliff's words only: from here up the load is what to change; below it, a wide interval is mostly the
# engine's own spread (gemma's ±31 % at 33 % was told "near capacity"), though more replicas still help.
NEAR_CAPACITY = 0.6
# The engine model's own error serving traffic, as shares of every cost (the module's words).
MODEL_SLOWER = 0.15
MODEL_FASTER = 0.05
MODEL_BOUNDS = (1 + MODEL_SLOWER, 1 - MODEL_FASTER)  # what the two bound replays scale every cost by
MODEL_ERROR_WORDS = f"the model's own error, every cost +{MODEL_SLOWER:.0%} and -{MODEL_FASTER:.0%}"


def spread_of(central: float | None, passes: Sequence[float | None]) -> Interval | None:
    """The central figure with the prediction interval the passes' figures give it; None for an unknown
    central figure; a point (n=1) when fewer than two passes have the figure."""
    if central is None:
        return None
    ratios = [p / central for p in passes if p is not None and central > 0 and p > 0]
    if len(ratios) < 2:
        return Interval(central, central, central, 1)
    factor = prediction_interval(ratios, CONFIDENCE)
    # The figure shown is the pooled fit's replay; the passes say how far from it a day's figure may land.
    low, high = central * factor.low / factor.mid, central * factor.high / factor.mid
    return Interval(min(low, central), central, max(high, central), len(ratios))


_Z = {0.9: 1.645, 0.95: 1.960}  # the normal's two-sided quantiles, for the order statistics' ranks


def quantile_interval(values: Sequence[float], q: float, confidence: float = CONFIDENCE) -> Interval | None:
    """Where the q-quantile of `values` lands when the same number of requests is drawn again: the order
    statistics whose ranks bound it (distribution-free; the binomial's normal approximation). The replay
    gives each request one TTFT, a real engine a little more or less: a trace of a few hundred requests has
    only a few in its top percent, and its p99 moves with them. None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    n = len(ordered)
    half = _Z[confidence] * math.sqrt(n * q * (1 - q))
    low = ordered[max(0, math.floor(n * q - half) - 1)]
    high = ordered[min(n - 1, math.ceil(n * q + half) - 1)]
    mid = ordered[max(0, min(n - 1, math.ceil(q * n) - 1))]  # bench.percentile's nearest rank
    return Interval(low, mid, high, n)


def widen(spread: Interval | None, sampling: Interval | None) -> Interval | None:
    """The passes' interval stretched to cover the sampling one too (around the same figure)."""
    if spread is None or sampling is None:
        return spread
    low = (
        spread.mid * min(spread.low / spread.mid, sampling.low / sampling.mid)
        if spread.mid > 0
        else spread.low
    )
    high = (
        spread.mid * max(spread.high / spread.mid, sampling.high / sampling.mid)
        if spread.mid > 0
        else spread.high
    )
    return Interval(min(low, spread.low), spread.mid, max(high, spread.high), max(spread.n, 2))


@dataclass(frozen=True, slots=True)
class Spread:
    """One model's figures in one fleet, with intervals (None: unknown). `load`: offered over modelled
    capacity."""

    model: str
    p50: Interval | None
    p99: Interval | None
    load: Interval | None
    refused: tuple[int, int, int]  # (fewest over the replays, the pooled replay's, most)
    requests: int


def figure_spread(
    central: Figures,
    passes: Sequence[Figures | None],
    load: float | None = None,
    pass_loads: Sequence[float | None] = (),
    ttfts: Sequence[float] = (),
    bounds: Sequence[Figures | None] = (),
) -> Spread:
    """A model's figures with their intervals: over the passes' replays, widened by the trace's own sampling
    of its percentiles (`quantile_interval` over the pooled replay's TTFTs, `ttfts`) where given, and by the
    replays at the model's own error (`bounds`: MODEL_SLOWER and MODEL_FASTER) where given."""
    refused = [sum(central.refused.values())] + [sum(p.refused.values()) for p in passes if p is not None]
    return Spread(
        central.model,
        figure_interval(
            central.ttft_p50_ms,
            [p.ttft_p50_ms if p else None for p in passes],
            quantile_interval(ttfts, 0.5),
            [b.ttft_p50_ms if b else None for b in bounds],
        ),
        figure_interval(
            central.ttft_p99_ms,
            [p.ttft_p99_ms if p else None for p in passes],
            quantile_interval(ttfts, 0.99),
            [b.ttft_p99_ms if b else None for b in bounds],
        ),
        spread_of(load, pass_loads),
        (min(refused), refused[0], max(refused)),
        central.requests,
    )


def figure_interval(
    central: float | None,
    passes: Sequence[float | None],
    sampling: Interval | None,
    bounds: Sequence[float | None] = (),
) -> Interval | None:
    """A figure's interval: the passes', widened by the sampling's and by the bounds' figures (the replays at
    the model's own error) where given; None for an unknown figure."""
    spread = widen(spread_of(central, passes), sampling)
    known = [b for b in bounds if b is not None]
    if spread is None or not known:
        return spread
    reach = [*known, spread.mid]
    return widen(spread, Interval(min(reach), spread.mid, max(reach), 2))


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str  # "pass", "fail" or "undecided"
    words: str


def verdict_state(interval: Interval, limit: float, *, at_least: bool = False) -> str:
    """ "fail" when the whole interval is past `limit`, "pass" when it is all within, else "undecided" (it
    straddles the limit). `at_least`: the figure must reach the limit (availability), not stay under it."""
    if at_least:
        if interval.high < limit:
            return "fail"
        return "pass" if interval.low >= limit else "undecided"
    if interval.low > limit:
        return "fail"
    return "pass" if interval.high <= limit else "undecided"


def judge_ratio(
    model: str,
    central: tuple[float, float],
    passes: Sequence[tuple[float, float] | None],
    max_increase: float,
) -> Verdict:
    """Planned over current p99 (the pooled pair and each pass's pair) against 1 + `max_increase`."""
    before, after = central
    ratio = spread_of(
        after / before if before > 0 else math.inf,
        [a / b if b > 0 else None for a, b in (p for p in passes if p is not None)],
    )
    assert ratio is not None
    state = verdict_state(ratio, 1 + max_increase)
    shown = ratio.text(2) if ratio.n > 1 else f"{ratio.mid:.2f} (no spread measured)"
    words = (
        f"model {model}: p99 TTFT {before:.0f} ms -> {after:.0f} ms, planned/current {shown} "
        f"against at most {1 + max_increase:.2f} (spec.plan.simulate.max_p99_ttft_increase)"
    )
    if state == "undecided":
        words += ": the interval straddles the threshold, neither passed nor failed"
    return Verdict(state, words)


def judge_slo(model: str, p99: Interval, slo_ms: float) -> Verdict:
    state = verdict_state(p99, slo_ms)
    said = {"pass": "met", "fail": "missed", "undecided": "undecided: the interval straddles it"}[state]
    return Verdict(state, f"model {model}: p99 TTFT {p99.text()} ms against its SLO {slo_ms:g} ms: {said}")


def reliable_load(speed_spread: float, target: float = RELIABLE) -> float | None:
    """The offered load (share of modelled capacity) up to which a speed error of ±`speed_spread` over the
    passes, with the model's own error (MODEL_SLOWER, its wider side), moves the queued TTFT by at most
    ±`target` (1/(1-load) amplification); None: not even an idle fleet (the engine's own spread is wider than
    the target)."""
    error = math.hypot(speed_spread, MODEL_SLOWER)
    if error >= target:
        return None
    return 1.0 - error / target


def offered_load(
    requests: Sequence[TracedRequest], duration_s: float | None, engines: Mapping[str, Sequence[EngineModel]]
) -> dict[str, tuple[float, float]]:
    """Per model with replicas: (requests/s offered, that over what its replicas' models complete per second
    at its requests' mean prompt and completion, all slots busy)."""
    by_model: dict[str, list[TracedRequest]] = {}
    for r in requests:
        by_model.setdefault(r.model, []).append(r)
    span = duration_s or (max(r.t for r in requests) if requests else 0.0)
    out: dict[str, tuple[float, float]] = {}
    for model, mine in by_model.items():
        replicas = engines.get(model) or ()
        if not replicas or span <= 0:
            continue
        prompt = round(sum(r.prompt_tokens for r in mine) / len(mine))
        completion = round(sum(r.completion_tokens for r in mine) / len(mine))
        capacity = sum(e.requests_per_s(prompt, completion) for e in replicas)
        rate = len(mine) / span
        out[model] = (rate, rate / capacity if capacity > 0 else math.inf)
    return out


def cliff_words(spread: Spread, replicas: int, rate_per_s: float) -> str | None:
    """What the plan says of a model whose p99 interval is wider than RELIABLE; None: it is not."""
    if spread.p99 is None or spread.p99.n < 2 or spread.p99.relative <= RELIABLE:
        return None
    head = f"model {spread.model}: p99 TTFT ±{spread.p99.relative:.0%}"
    if spread.load is None or spread.load.mid <= 0:
        return f"{head}: the prediction is not reliable to ±{RELIABLE:.0%}"
    head += f" at {spread.load.mid:.0%} of modelled capacity"
    speed = spread.load.relative if spread.load.n > 1 else 0.0
    limit = reliable_load(speed)
    if limit is None:
        return (
            f"{head}: the engine's speed itself {_spreads(speed)}, so no load makes the prediction reliable (it is "
            "least reliable near capacity): bench again in a quieter hour"
        )
    if spread.load.mid <= limit * 1.05:  # at the limit already (within its own rounding): not the load's
        return (
            f"{head}: not the load's doing (at most {limit:.0%} of capacity keeps it within ±{RELIABLE:.0%}): "
            "the engine's own spread, or the few requests in the trace's top percent"
        )
    need = math.ceil(replicas * spread.load.mid / limit)
    why = (
        "near capacity the prediction is least reliable (a small error in the engine's speed moves the queue "
        "most)"
        if spread.load.mid >= NEAR_CAPACITY
        else f"the engine's speed {_spreads(speed)}, and even this far from capacity the queue multiplies that"
    )
    return (
        f"{head}: {why}; it holds to ±{RELIABLE:.0%} up to ~{limit:.0%} of capacity: {need} replicas instead "
        f"of {replicas}, or at most {rate_per_s * limit / spread.load.mid:.2f} requests/s"
    )


def _spreads(speed: float) -> str:
    return f"spreads ±{speed:.0%} over the bench's passes (beside the model's own +{MODEL_SLOWER:.0%})"


def _ms(value: Interval | None) -> str:
    return "-" if value is None else value.text()


def spread_row(label: str, s: Spread | None) -> str:
    """A fleet's figures with their intervals, as the plan prints them."""
    if s is None:
        return f"  {label:<8} no requests"
    low, mid, high = s.refused
    refused = f"{mid}" if low == high else f"{mid} [{low}, {high}]"
    load = "" if s.load is None else f"  load {_pct(s.load)}"
    return f"  {label:<8} p50 {_ms(s.p50)} ms  p99 {_ms(s.p99)} ms  refused {refused}/{s.requests}{load}"


def _pct(value: Interval) -> str:
    if value.n <= 1:
        return f"{value.mid:.0%}"
    return f"{value.mid:.0%} [{value.low:.0%}, {value.high:.0%}]"


def spread_section(
    current: Mapping[str, Spread], planned: Mapping[str, Spread], passes: int, notes: Sequence[str]
) -> list[str]:
    """The lines `plan --simulate` adds: the intervals' meaning, each model's figures with them, the notes."""
    lines = [
        "",
        f"With their intervals ({CONFIDENCE:.0%}: one replay per bench pass, {passes} passes, the trace's "
        f"own sampling of its percentiles, and {MODEL_ERROR_WORDS}, around the pooled fit's replay):",
    ]
    for model in sorted(set(current) | set(planned)):
        lines.append(f"model {model}")
        lines.append(spread_row("current", current.get(model)))
        lines.append(spread_row("planned", planned.get(model)))
    lines.extend(notes)
    return lines
