"""Synthetic traces (the `llmgw.core.traffic.trace` format) for `plan --simulate` without a recorded one, and for the
replay benchmarks. Pure: the rng is a parameter.

- `steady`: Poisson arrivals per model at a fixed rate. `plan --simulate` with no TRACE uses it at
  DEFAULT_LOAD of what the current fleet's engine models say each model's replicas complete per second, for
  DEFAULT_MINUTES, with DEFAULT_PROMPT_TOKENS / DEFAULT_COMPLETION_TOKENS per request, from one project
  `synthetic`: a fleet that halves a model's replicas then runs it at full load, and the replay shows it.
- `diurnal`: one model's arrivals over a day whose rate follows a raised cosine from `trough` x peak at
  04:00 to the peak at 16:00 (a non-homogeneous Poisson process, drawn by thinning).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.core.traffic.trace import TracedRequest, TraceHeader

__all__ = [
    "DEFAULT_COMPLETION_TOKENS",
    "DEFAULT_LOAD",
    "DEFAULT_MINUTES",
    "DEFAULT_PROMPT_TOKENS",
    "Shape",
    "diurnal",
    "diurnal_rate",
    "steady",
]

DEFAULT_LOAD = 0.5
DEFAULT_MINUTES = 10.0
DEFAULT_PROMPT_TOKENS = 256
DEFAULT_COMPLETION_TOKENS = 128


@dataclass(frozen=True, slots=True)
class Shape:
    """Every request's size; completions vary uniformly within `spread` of the mean (0: all the same)."""

    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    completion_tokens: int = DEFAULT_COMPLETION_TOKENS
    spread: float = 0.5
    project: str = "synthetic"
    stream: bool = True

    def draw(self, t: float, model: str, rng: random.Random) -> TracedRequest:
        lo = max(1, round(self.completion_tokens * (1 - self.spread)))
        hi = max(lo, round(self.completion_tokens * (1 + self.spread)))
        return TracedRequest(
            t, model, self.project, self.prompt_tokens, rng.randint(lo, hi), stream=self.stream
        )


def steady(
    rates: Mapping[str, float], seconds: float, rng: random.Random, shape: Shape = Shape()
) -> tuple[TraceHeader, list[TracedRequest]]:
    """Poisson arrivals of each model at its rate (requests per second), merged in arrival order."""
    out: list[TracedRequest] = []
    for model, rate in sorted(rates.items()):
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            out.append(shape.draw(t, model, rng))
    out.sort(key=lambda r: r.t)
    rate_words = ", ".join(f"{m} {r:.3g}/s" for m, r in sorted(rates.items()))
    return TraceHeader(0.0, seconds, f"synthetic steady: {rate_words}"), out


def diurnal_rate(t: float, peak: float, trough: float) -> float:
    """Requests per second at `t` seconds after midnight: peak at 16:00, trough x peak at 04:00."""
    phase = math.cos(2 * math.pi * (t / 86400.0 - 16.0 / 24.0))
    return peak * (trough + (1 - trough) * (1 + phase) / 2)


def diurnal(
    model: str,
    peak: float,
    rng: random.Random,
    *,
    hours: float = 24.0,
    trough: float = 0.2,
    shape: Shape = Shape(),
) -> tuple[TraceHeader, list[TracedRequest]]:
    """`hours` of one model's arrivals peaking at `peak` requests per second (see the module's words)."""
    seconds = hours * 3600.0
    out: list[TracedRequest] = []
    t = 0.0
    while peak > 0:
        t += rng.expovariate(peak)
        if t >= seconds:
            break
        if rng.random() * peak <= diurnal_rate(t, peak, trough):
            out.append(shape.draw(t, model, rng))
    return TraceHeader(0.0, seconds, f"synthetic diurnal: {model} peak {peak:.3g}/s"), out
