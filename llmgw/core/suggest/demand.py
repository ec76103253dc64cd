"""What a trace asks of each model, hour by hour: arrivals per second and the requests' sizes, per project (a
traffic class, which may carry its own objectives). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.core.capacity.bench import percentile
from llmgw.core.traffic.trace import TracedRequest

__all__ = ["HOUR_S", "ClassDemand", "Demand", "busiest", "demand_by_hour", "periods_of"]

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class ClassDemand:
    """One project's requests to one model within one period."""

    project: str
    rate_per_s: float
    prompt_mean: float
    prompt_p90: float
    prompt_p99: float
    completion_mean: float


@dataclass(frozen=True, slots=True)
class Demand:
    """One model's requests within one period (an hour of the trace, or all of a shorter trace)."""

    model: str
    period: int  # the hour's index from the trace's start
    seconds: float
    rate_per_s: float
    prompt_mean: float
    completion_mean: float
    classes: tuple[ClassDemand, ...]


def _class(project: str, requests: Sequence[TracedRequest], seconds: float) -> ClassDemand:
    prompts = [float(r.prompt_tokens) for r in requests]
    return ClassDemand(
        project,
        len(requests) / seconds,
        sum(prompts) / len(prompts),
        percentile(prompts, 0.9) or 0.0,
        percentile(prompts, 0.99) or 0.0,
        sum(r.completion_tokens for r in requests) / len(requests),
    )


def demand_by_hour(requests: Sequence[TracedRequest], duration_s: float) -> dict[str, list[Demand]]:
    """Per model, its demand in each hour of the trace (one period for a trace of an hour or less); an hour
    with no request of the model is left out (it needs no replica beyond the minimum)."""
    periods = periods_of(requests, duration_s)
    seconds = max(duration_s, requests[-1].t if requests else 0.0, 1.0) if periods == 1 else HOUR_S
    buckets: dict[tuple[str, int], list[TracedRequest]] = {}
    for r in requests:
        buckets.setdefault((r.model, min(periods - 1, int(r.t // seconds))), []).append(r)
    out: dict[str, list[Demand]] = {}
    for (model, period), found in sorted(buckets.items()):
        projects: dict[str, list[TracedRequest]] = {}
        for r in found:
            projects.setdefault(r.project, []).append(r)
        out.setdefault(model, []).append(
            Demand(
                model,
                period,
                seconds,
                len(found) / seconds,
                sum(r.prompt_tokens for r in found) / len(found),
                sum(r.completion_tokens for r in found) / len(found),
                tuple(_class(p, rs, seconds) for p, rs in sorted(projects.items())),
            )
        )
    return out


def periods_of(requests: Sequence[TracedRequest], duration_s: float) -> int:
    """How many periods `demand_by_hour` cuts the trace into."""
    span = max(duration_s, requests[-1].t if requests else 0.0, 1.0)
    return max(1, math.ceil(span / HOUR_S - 1e-9))


def busiest(requests: Sequence[TracedRequest], duration_s: float) -> int:
    """The period with the most requests (the first of equals)."""
    periods = periods_of(requests, duration_s)
    if periods == 1:
        return 0
    counts = [0] * periods
    for r in requests:
        counts[min(periods - 1, int(r.t // HOUR_S))] += 1
    return counts.index(max(counts))
