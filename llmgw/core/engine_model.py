"""An engine replica as `plan --simulate` models it: from the curve `llmgw bench --save` measured, never from an
engine's own arguments (a sim engine told to answer in 50 ms is not evidence of what it does under load).

A bench run drives one replica at concurrency 1, 2, 4, ... and records per step the p50 time to first token and
inter-token latency. The model reads that curve:

- **TTFT** of a request that finds n requests in flight on the replica (itself included) is the curve's p50
  TTFT at n minus its TTFT at 1 (what contention adds), plus the measured prefill cost per token times the
  request's prompt tokens. Between steps the curve is interpolated linearly; past the last step the TTFT keeps
  growing along the last segment's slope (queueing grows linearly with the queue), and the inter-token latency
  stays at the last step's.
- **Duration** is the TTFT plus (completion tokens - 1) inter-token gaps at n.
- **Capacity** (for utilization) is the replica's declared slots, else the measured concurrency at the model's
  objective, else the highest step measured.

A profile without a measurement gets the stated defaults below, and `assumptions` says so in words the CLI
prints: nothing unknown is passed off as measured.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ASSUMED_ITL_MS",
    "ASSUMED_PREFILL_MS_PER_TOKEN",
    "ASSUMED_SLOTS",
    "EngineModel",
    "assumed_model",
    "fit_engine_model",
]

# What a profile nobody measured is assumed to do: a small model on one GPU, flat up to its slots.
ASSUMED_PREFILL_MS_PER_TOKEN = 0.5
ASSUMED_ITL_MS = 20.0
ASSUMED_SLOTS = 4

Point = tuple[float, float]  # (concurrency, milliseconds)


def _interpolate(points: Sequence[Point], x: float) -> float:
    """Linear between the points, flat below the first, along the last segment's slope past the last."""
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + max(0.0, (y1 - y0) / (x1 - x0)) * (x - x1)


@dataclass(frozen=True, slots=True)
class EngineModel:
    """One replica's latency as a function of its load; see the module's words."""

    prefill_ms_per_token: float
    ttft_ms: tuple[Point, ...]  # p50 TTFT per concurrency step, increasing concurrency; at least one point
    itl_ms: tuple[Point, ...]  # p50 inter-token latency per concurrency step
    capacity: int  # concurrent sequences, for utilization
    measured: bool
    assumptions: tuple[str, ...] = ()  # what was not measured and what stands in for it, in words
    fixed_ms: float = 0.0  # TTFT that does not depend on the prompt (only when no prefill cost is known)

    def ttft(self, inflight: int, prompt_tokens: int) -> float:
        contention = _interpolate(self.ttft_ms, inflight) - self.ttft_ms[0][1]
        return self.fixed_ms + max(0.0, contention) + self.prefill_ms_per_token * prompt_tokens

    def itl(self, inflight: int) -> float:
        if inflight >= self.itl_ms[-1][0]:
            return self.itl_ms[-1][1]
        return _interpolate(self.itl_ms, inflight)

    def duration(self, inflight: int, prompt_tokens: int, completion_tokens: int) -> tuple[float, float]:
        """(TTFT, whole duration) in ms of a request that starts with `inflight` on the replica."""
        first = self.ttft(inflight, prompt_tokens)
        return first, first + max(0, completion_tokens - 1) * self.itl(inflight)

    def requests_per_s(self, prompt_tokens: int, completion_tokens: int) -> float:
        """What the replica completes per second when `capacity` requests are always in flight."""
        _, ms = self.duration(self.capacity, prompt_tokens, completion_tokens)
        return self.capacity * 1000.0 / max(ms, 1e-3)


def assumed_model(slots: int | None, why: str) -> EngineModel:
    """The stated defaults, flat up to the slots (declared, else ASSUMED_SLOTS)."""
    capacity = slots or ASSUMED_SLOTS
    words = (
        f"{why}: assumed prefill {ASSUMED_PREFILL_MS_PER_TOKEN:g} ms/token, {ASSUMED_ITL_MS:g} ms between "
        f"tokens, no slowdown up to {capacity} concurrent"
        + ("" if slots else f" (no slots declared: {ASSUMED_SLOTS} assumed)")
    )
    return EngineModel(
        prefill_ms_per_token=ASSUMED_PREFILL_MS_PER_TOKEN,
        ttft_ms=((1.0, 0.0), (float(capacity), 0.0)),
        itl_ms=((1.0, ASSUMED_ITL_MS),),
        capacity=capacity,
        measured=False,
        assumptions=(words,),
    )


def _points(curve: Sequence[Mapping[str, Any]], key: str) -> tuple[Point, ...]:
    out: list[Point] = []
    for step in sorted(curve, key=lambda s: int(s.get("concurrency") or 0)):
        value, conc = step.get(key), step.get("concurrency")
        failed = step.get("failed") or 0
        requests = step.get("requests") or 0
        if isinstance(value, int | float) and isinstance(conc, int) and conc >= 1 and requests > failed:
            out.append((float(conc), float(value)))
    return tuple(out)


def fit_engine_model(measured: Mapping[str, Any] | None, slots: int | None, where: str) -> EngineModel:
    """The model of a replica from its stored measurement (a `llmgw capacity --json` row's `measured`: the
    curve, prefill and decode ms per token, concurrency); `slots` is what its profile declares. `where` names
    the profile in the assumptions' words."""
    if measured is None:
        return assumed_model(slots, f"{where}: not measured (`llmgw bench MODEL --profile P --save`)")
    curve = measured.get("curve") or []
    ttft = _points(curve, "ttft_p50_ms")
    itl = _points(curve, "itl_p50_ms")
    if not ttft:
        return assumed_model(slots, f"{where}: its measurement has no TTFT step that served a request")
    notes: list[str] = []
    prefill, fixed = measured.get("prefill_ms_per_token"), 0.0
    if not isinstance(prefill, int | float):
        # The TTFT at the first step is all the prompt cost there is to know; without the prompt size it
        # cannot be split per token, so it stands as a fixed cost.
        prefill, fixed = 0.0, ttft[0][1]
        notes.append(f"{where}: no prefill cost per token measured: the prompt's length is not modelled")
    if not itl:
        decode = measured.get("decode_ms_per_token")
        itl = ((1.0, float(decode) if isinstance(decode, int | float) else ASSUMED_ITL_MS),)
        if not isinstance(decode, int | float):
            notes.append(f"{where}: no inter-token latency measured: {ASSUMED_ITL_MS:g} ms assumed")
    concurrency = measured.get("concurrency")
    capacity = slots or (concurrency if isinstance(concurrency, int) and concurrency >= 1 else None)
    if capacity is None:
        capacity = int(ttft[-1][0])
        notes.append(
            f"{where}: no slots declared, no concurrency met the objective: {capacity} (the top step)"
        )
    return EngineModel(float(prefill), ttft, itl, capacity, True, tuple(notes), fixed)
