"""What `llmgw bench` concludes from a stepped load, as pure functions: per step the latencies measured, and
the capacity at the model's objective.

A run drives one replica at concurrency 1, 2, 4, ... for a while each and records, per request, the time to
first token and the gaps between tokens. `summarize_step` turns one step's samples into its row of the curve;
`conclude` reads the curve: the capacity is the highest concurrency whose p99 TTFT stays under the objective
(with no objective, the highest step whose throughput still grew by a tenth over the step before: past the knee
more sequences only queue), tokens/s at that step, and prefill and decode cost per token from the step at
concurrency 1 (where nothing queues).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Measured", "RequestSample", "Step", "conclude", "percentile", "summarize_step"]


@dataclass(frozen=True, slots=True)
class RequestSample:
    ttft_s: float
    gaps_s: tuple[float, ...]  # between one token and the next
    tokens: int  # completion tokens (or chunks) received
    ok: bool = True


@dataclass(frozen=True, slots=True)
class Step:
    concurrency: int
    requests: int
    failed: int
    seconds: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tokens_per_s: float

    def json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Measured:
    concurrency: int | None  # None: not even one sequence stayed under the objective
    tokens_per_s: float | None
    prefill_ms_per_token: float | None
    decode_ms_per_token: float | None
    objective_ms: float | None
    curve: tuple[Step, ...]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile by the nearest-rank rule; None for no values (unknown, not 0)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


def summarize_step(concurrency: int, samples: Sequence[RequestSample], seconds: float) -> Step:
    good = [s for s in samples if s.ok]
    ttfts = [s.ttft_s for s in good]
    gaps = [g for s in good for g in s.gaps_s]
    tokens = sum(s.tokens for s in good)
    return Step(
        concurrency=concurrency,
        requests=len(samples),
        failed=len(samples) - len(good),
        seconds=round(seconds, 3),
        ttft_p50_ms=_ms(percentile(ttfts, 0.5)),
        ttft_p99_ms=_ms(percentile(ttfts, 0.99)),
        itl_p50_ms=_ms(percentile(gaps, 0.5)),
        itl_p99_ms=_ms(percentile(gaps, 0.99)),
        tokens_per_s=round(tokens / seconds, 3) if seconds > 0 else 0.0,
    )


def _knee(curve: Sequence[Step]) -> Step | None:
    best: Step | None = None
    for step in curve:
        if step.failed or step.requests == 0:
            break
        if best is not None and step.tokens_per_s < best.tokens_per_s * 1.1:
            break
        best = step
    return best


def conclude(curve: Sequence[Step], objective_ms: float | None, prompt_tokens: int) -> Measured:
    """The capacity the curve shows (see the module's words). A step with failures ends the search."""
    curve = tuple(sorted(curve, key=lambda s: s.concurrency))
    if objective_ms is None:
        chosen = _knee(curve)
    else:
        chosen = None
        for step in curve:
            if step.failed or step.ttft_p99_ms is None or step.ttft_p99_ms > objective_ms:
                break
            chosen = step
    single = next((s for s in curve if s.concurrency == 1 and s.requests > s.failed), None)
    prefill = None
    if single is not None and single.ttft_p50_ms is not None and prompt_tokens > 0:
        prefill = round(single.ttft_p50_ms / prompt_tokens, 4)
    return Measured(
        concurrency=chosen.concurrency if chosen else None,
        tokens_per_s=chosen.tokens_per_s if chosen else None,
        prefill_ms_per_token=prefill,
        decode_ms_per_token=single.itl_p50_ms if single is not None else None,
        objective_ms=objective_ms,
        curve=curve,
    )
