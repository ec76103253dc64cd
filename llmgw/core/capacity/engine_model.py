"""An engine replica as `plan --simulate` models it: from the curve `llmgw bench --save` measured, never from an
engine's own arguments (a sim engine told to answer in 50 ms is not evidence of what it does under load).

A bench run drives one replica at concurrency 1, 2, 4, ... with prompts of one length, plus two steps at
concurrency 1 with prompts a quarter and twice as long, and records per step the p50 time to first token, the p50
inter-token latency, the prompt tokens the engine counted, and what it completed per second. The model:

- **Prefill** of a request of P prompt tokens takes `fixed_ms + prefill_ms_per_token * P +
  prefill_ms_per_token_sq * P^2` of the replica's time: the parabola through the three concurrency-1 steps'
  TTFTs (nothing queues there; the ladder's prompt, a quarter of it and twice it), the line through two
  where a bench has no long step or the parabola would bend down. Attention makes the square: once on
  llama.cpp on CPU here, the 830-token prompt took 6.6 ms a token more than the 390-token one against 4.4
  from 100 to 390 (another run measured no square at all: the three points say which), and a trace's long
  prompts are what a line through short ones would underprice. A share `exclusive` of it
  holds the whole replica: no other prefill and no decode advances meanwhile (llama.cpp runs one batch at a
  time, and a prompt's batch stalls every slot's next token; a sim engine only sleeps, so its share is 0).
  The exclusive parts queue first come, first served; the rest runs in the request's own slot.
- **Decode**: while no exclusive prefill runs, each of the k sequences decoding gets a token every `itl(k)`
  ms: the p50 gap between tokens at concurrency k times the engine's own stall ratio, measured at concurrency
  1 (`itl_mean_ms`, its completions' spans over their tokens after the first, over its p50 gap: a completion
  takes the sum of its gaps, and on a busy CPU the few long ones are much of it); linear between the steps,
  the last step's past it. Above concurrency 1 the spans are longer still, by the other requests' prefills
  stalling every sequence: that time is the exclusive share's (below), not the decode's.
- `exclusive` is fitted so that the model completes, at the ladder's highest step within the capacity (past
  it the engine queues requests itself), what the bench measured there: at S concurrent requests of prefill p and d decode ms, a closed loop completes
  S / (S*x*p + (1-x)*p + d) per ms for share x, solved for x and kept within [0, 1].
- **Contention**: where even wholly exclusive prefills (x = 1) would have completed more than the bench did,
  the rest is put on the prefills that start beside other sequences: each sequence already in flight
  stretches a prefill by `contention` of its concurrency-1 time, so a closed loop of S completes
  S / (S*p*(1 + c*(S-1)) + d) per ms, solved for c. Seen once on llama.cpp on CPU here: 4.4 s to the first
  token at concurrency 2 for prompts that took 1.6 s alone, where one after the other would give 3.2 s.
- **Capacity** (for utilization) is the replica's declared slots, else the measured concurrency at the model's
  objective, else the highest step measured.

The model runs in `llmgw.core.capacity.engine_run` (a replica's sequences advanced in virtual time). It ignores: the
prefix cache (the bench's prompts are distinct), prompt batching across slots (two prompts that arrive together
are prefilled one after the other), context length, and the engine's own queue (the router does not send a
replica more than its slots). A profile without a measurement gets the stated defaults below, and
`assumptions` says so in words the CLI prints: nothing unknown is passed off as measured.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmgw.core.capacity.bench import probe_positions

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
    """Linear between the points, flat below the first and past the last."""
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


@dataclass(frozen=True, slots=True)
class EngineModel:
    """One replica's costs; see the module's words."""

    prefill_ms_per_token: float
    itl_ms: tuple[Point, ...]  # p50 inter-token latency per concurrency step; at least one point
    capacity: int  # concurrent sequences, for utilization
    measured: bool
    assumptions: tuple[str, ...] = ()  # what was not measured and what stands in for it, in words
    fixed_ms: float = 0.0  # prefill time that does not depend on the prompt's length
    exclusive: float = 0.0  # the share of a prefill that holds the whole replica, in [0, 1]
    contention: float = 0.0  # a prefill's stretch per other sequence in flight, a share of its own time
    prefill_ms_per_token_sq: float = 0.0  # the prompt's quadratic cost (attention), from a third length

    def prefill_ms(self, prompt_tokens: int, others: int = 0) -> float:
        """A prefill's time, started beside `others` sequences in flight."""
        n = max(0, prompt_tokens)
        alone = self.fixed_ms + self.prefill_ms_per_token * n + self.prefill_ms_per_token_sq * n * n
        return alone * (1.0 + self.contention * max(0, others))

    def itl(self, decoding: int) -> float:
        return _interpolate(self.itl_ms, max(1, decoding))

    def requests_per_s(self, prompt_tokens: int, completion_tokens: int) -> float:
        """What the replica completes per second when `capacity` requests are always in flight."""
        return 1000.0 * closed_loop_per_ms(
            self.capacity,
            self.prefill_ms(prompt_tokens, self.capacity - 1),
            max(0, completion_tokens - 1) * self.itl(self.capacity),
            self.exclusive,
        )


def closed_loop_per_ms(slots: int, prefill_ms: float, decode_ms: float, exclusive: float) -> float:
    """Requests completed per ms by `slots` requests always in flight: each cycle of `slots` requests spends
    their exclusive prefills one after the other and the rest of one request's time side by side."""
    cycle = slots * exclusive * prefill_ms + (1 - exclusive) * prefill_ms + decode_ms
    return slots / max(cycle, 1e-6)


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
        itl_ms=((1.0, ASSUMED_ITL_MS),),
        capacity=capacity,
        measured=False,
        assumptions=(words,),
    )


def _served(step: Mapping[str, Any]) -> bool:
    """A pooled step that served. A step of one repeat (`repeat` set: `llmgw bench --repeats`) is one pass's
    share of a pooled step beside it, read by `llmgw.core.capacity.engine_spread`, not here."""
    return (
        step.get("repeat") is None
        and isinstance(step.get("concurrency"), int)
        and (step.get("requests") or 0) > (step.get("failed") or 0)
    )


def _ladder(
    curve: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The concurrency ladder (one prompt length, by concurrency) and the prompt probes that served (the
    short and the long concurrency-1 steps, by the bench's own rule, `probe_positions`)."""
    served = sorted((s for s in curve if _served(s)), key=lambda s: int(s["concurrency"]))
    keys = []
    for step in served:
        n = step.get("prompt_tokens")
        keys.append(
            (
                int(step["concurrency"]),
                float(n) if isinstance(n, int | float) else None,
                str(step.get("role") or "ladder"),
            )
        )
    probes = {at for at in probe_positions(keys) if at is not None}
    return [s for i, s in enumerate(served) if i not in probes], [served[i] for i in sorted(probes)]


def _points(steps: Sequence[Mapping[str, Any]], key: str) -> tuple[Point, ...]:
    out: dict[float, float] = {}
    for step in steps:
        value = step.get(key)
        if isinstance(value, int | float):
            out.setdefault(float(step["concurrency"]), float(value))
    return tuple(sorted(out.items()))


Prefill = tuple[float, float, float]  # (fixed ms, ms per token, ms per token squared)


def _prefill(
    measured: Mapping[str, Any], ladder: Sequence[Mapping[str, Any]], probes: Sequence[Mapping[str, Any]]
) -> Prefill | None:
    """The prefill's cost from the concurrency-1 TTFTs at two prompt lengths (a line) or three (a parabola:
    attention grows with the square of the prompt), else the stored per-token cost alone; None: no prompt
    cost known."""
    single = next((s for s in ladder if s["concurrency"] == 1), None)
    points = sorted(
        (float(s["prompt_tokens"]), float(s["ttft_p50_ms"]))
        for s in ([single] if single is not None else []) + list(probes)
        if isinstance(s.get("ttft_p50_ms"), int | float) and isinstance(s.get("prompt_tokens"), int | float)
    )
    lengths = {n for n, _ in points}
    if len(points) == 3 and len(lengths) == 3:
        fitted = _parabola(points)
        if fitted is not None:
            return fitted
        points = [points[0], points[2]]  # a parabola bending down: the line through the outer two
    if len(points) >= 2 and len(lengths) >= 2:
        (n_short, t_short), (n_long, t_long) = points[0], points[-1]
        per = max(0.0, (t_long - t_short) / (n_long - n_short))
        return max(0.0, t_short - per * n_short), per, 0.0
    stored = measured.get("prefill_ms_per_token")
    return (0.0, float(stored), 0.0) if isinstance(stored, int | float) else None


def _parabola(points: Sequence[tuple[float, float]]) -> Prefill | None:
    """a + b*n + c*n^2 through three points, when it neither bends down (c < 0) nor falls (b < 0) nor starts
    below zero; None otherwise."""
    (x0, y0), (x1, y1), (x2, y2) = points
    d01, d12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    c = (d12 - d01) / (x2 - x0)
    b = d01 - c * (x0 + x1)
    a = y0 - b * x0 - c * x0 * x0
    return (a, b, c) if c >= 0 and b >= 0 and a >= 0 else None


def _decode_points(ladder: Sequence[Mapping[str, Any]]) -> tuple[Point, ...]:
    """The decode cost per token at each step: its p50 gap times the engine's own stall ratio, concurrency 1's
    mean over its p50 (nothing else runs there, so what its span adds to its gaps is the engine's own). Not
    each step's mean: above concurrency 1 a stream's span also holds the other requests' prefills, which stall
    every sequence on the replica (llama.cpp and vLLM run one batch at a time). Those belong to the exclusive
    share, fitted from what the step completed; counted in the gaps too, they made the share near zero (0.07
    on vLLM's CPU build here) and a new request's first token never waited for another's prefill, so the
    replay of a trace that vLLM served at a p50 TTFT of 553 ms said 199 (docs/gitops.md). A bench without the
    mean or the p50 at concurrency 1 gives the one it has."""
    means, p50s = _points(ladder, "itl_mean_ms"), _points(ladder, "itl_p50_ms")
    if not means or not p50s or means[0][0] != 1.0 or p50s[0][0] != 1.0 or p50s[0][1] <= 0:
        return means or p50s
    own = max(1.0, means[0][1] / p50s[0][1])
    return tuple((at, gap * own) for at, gap in p50s)


def _exclusive(model: EngineModel, top: Mapping[str, Any]) -> tuple[float, float] | None:
    """(exclusive share, contention) that make the model complete, at the ladder's top step within the
    capacity, what the bench did there (see the module's words). None where the step does not say what it
    completed."""
    slots, requests, seconds = int(top["concurrency"]), top.get("requests") or 0, top.get("seconds")
    tokens_per_s, prompt = top.get("tokens_per_s"), top.get("prompt_tokens")
    good = requests - (top.get("failed") or 0)
    if (
        slots < 2
        or not isinstance(seconds, int | float)
        or seconds <= 0
        or not isinstance(prompt, int | float)
    ):
        return None
    if not isinstance(tokens_per_s, int | float) or good <= 0:
        return None
    cycle = slots / (good / (seconds * 1000.0))  # ms for `slots` requests, side by side
    completion = tokens_per_s * seconds / good
    prefill = model.prefill_ms(round(prompt))
    decode = max(0.0, completion - 1) * model.itl(slots)
    if prefill <= 0:
        return None
    share = (cycle - decode - prefill) / (prefill * (slots - 1))
    if share <= 1.0:
        return max(0.0, share), 0.0
    return 1.0, (cycle - decode - slots * prefill) / (slots * prefill * (slots - 1))


def fit_engine_model(measured: Mapping[str, Any] | None, slots: int | None, where: str) -> EngineModel:
    """The model of a replica from its stored measurement (a `llmgw capacity --json` row's `measured`: the
    curve, prefill and decode ms per token, concurrency); `slots` is what its profile declares. `where` names
    the profile in the assumptions' words."""
    if measured is None:
        return assumed_model(slots, f"{where}: not measured (`llmgw bench MODEL --profile P --save`)")
    ladder, probes = _ladder(measured.get("curve") or [])
    ttft = _points(ladder, "ttft_p50_ms")
    if not ttft:
        return assumed_model(slots, f"{where}: its measurement has no TTFT step that served a request")
    notes: list[str] = []
    prefill = _prefill(measured, ladder, probes)
    if prefill is None:
        # The TTFT at the first step is all the prompt cost there is to know; without the prompt size it
        # cannot be split per token, so it stands as a fixed cost.
        prefill = (ttft[0][1], 0.0, 0.0)
        notes.append(f"{where}: no prefill cost per token measured: the prompt's length is not modelled")
    itl = _decode_points(ladder)
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
    model = EngineModel(prefill[1], itl, capacity, True, (), prefill[0], prefill_ms_per_token_sq=prefill[2])
    # Past the slots the engine queues requests itself: what it completes there says nothing of the share.
    within = [s for s in ladder if 2 <= s["concurrency"] <= capacity]
    fitted = _exclusive(model, within[-1]) if within else None
    if fitted is None:
        fitted = (0.0, 0.0)
        notes.append(
            f"{where}: no step above concurrency 1 says what it completed: prefills assumed not to "
            "hold up the other slots"
        )
    return EngineModel(
        prefill[1], itl, capacity, True, tuple(notes), prefill[0], *fitted, prefill_ms_per_token_sq=prefill[2]
    )
