"""What `llmgw bench` concludes from a stepped load, as pure functions: per step the latencies measured, and
the capacity at the model's objective.

A run drives one replica at concurrency 1, 2, 4, ... for a while each (the ladder), plus two steps at
concurrency 1 with prompts a quarter as long (the short step) and twice as long (the long step: a prompt's
cost grows faster than its length, attention being quadratic), and records, per request, the time to first
token, the gaps between tokens and the prompt tokens the engine counted (its `usage`). `summarize_step` turns
one step's samples into its row of the curve; `conclude` reads the curve: the capacity is the highest ladder
concurrency whose p99 TTFT stays under the objective (with no objective, the highest step whose throughput
still grew by a tenth over the step before: past the knee more sequences only queue), tokens/s at that step,
the decode cost per token from the ladder's concurrency 1 (where nothing queues), and the prefill cost per
token from the two concurrency-1 steps: the TTFT's growth per prompt token between them (without a short step
or a counted prompt, the TTFT at concurrency 1 over the prompt's words, fixed costs included).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "Measured",
    "RequestSample",
    "Step",
    "conclude",
    "percentile",
    "probe_positions",
    "split_probes",
    "summarize_step",
]


@dataclass(frozen=True, slots=True)
class RequestSample:
    ttft_s: float
    gaps_s: tuple[float, ...]  # between one token and the next
    tokens: int  # completion tokens (or chunks) received
    ok: bool = True
    prompt_tokens: int | None = None  # what the engine counted (its usage); None: it did not say
    completion_tokens: int | None = None  # likewise; None: it did not say, and `tokens` counts chunks

    def answer_tokens(self) -> int:
        """The completion's tokens: as the engine counted them, else the events received."""
        return self.completion_tokens if self.completion_tokens is not None else self.tokens


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
    prompt_tokens: float | None = None  # the mean the engine counted; None: it did not say
    itl_mean_ms: float | None = None  # a completion's span over its tokens after the first: its tail counts
    role: str = "ladder"  # or "short" / "long": a concurrency-1 probe of the prompt's cost, not a rung
    repeat: int | None = None  # which pass of `--repeats` (1, 2, ...); None: all passes pooled

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


def summarize_step(
    concurrency: int, samples: Sequence[RequestSample], seconds: float, role: str = "ladder"
) -> Step:
    good = [s for s in samples if s.ok]
    ttfts = [s.ttft_s for s in good]
    gaps = [g for s in good for g in s.gaps_s]
    tokens = sum(s.answer_tokens() for s in good)
    counted = [s.prompt_tokens for s in good if s.prompt_tokens is not None]
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
        prompt_tokens=round(sum(counted) / len(counted), 1) if counted else None,
        itl_mean_ms=_ms(decode_per_token(good)),
        role=role,
    )


def decode_per_token(samples: Sequence[RequestSample]) -> float | None:
    """What each token after the first costs, in seconds: the completions' spans from their first event to
    their last, over their counted tokens after the first. Not the mean gap between events: a stream's events
    are not its tokens. A sim engine sends its role a decode step before its first token, and every engine
    ends with a finish event right after its last token; the mean gap of a 48-token answer then came out 2 %
    short, and the replay, its requests 4 % too quick, put a sim fleet at 80 % of its capacity where it ran
    at 83 %: its p50 TTFT 50 ms where the fleet measured 70. A sample whose engine did not count its tokens
    counts its gaps (the events were its tokens). None: no sample had two tokens."""
    span, after_first = 0.0, 0
    for s in samples:
        if s.answer_tokens() >= 2 and s.gaps_s:
            span += sum(s.gaps_s)
            after_first += s.answer_tokens() - 1
    return span / after_first if after_first else None


def _knee(curve: Sequence[Step]) -> Step | None:
    best: Step | None = None
    for step in curve:
        if step.failed or step.requests == 0:
            break
        if best is not None and step.tokens_per_s < best.tokens_per_s * 1.1:
            break
        best = step
    return best


SHORT_AT_MOST = 0.75  # of the longest concurrency-1 prompt; the bench's short step is a quarter of it

StepKey = tuple[int, float | None, str]  # (concurrency, counted prompt tokens, role)


def probe_positions(steps: Sequence[StepKey]) -> tuple[int | None, int | None]:
    """Which of the steps are the short and the long probe. A bench that names its steps' roles is read by
    them. One before roles (a stored curve has none, so every step reads "ladder") had only a short step:
    the concurrency-1 step with the fewest prompt tokens, when that is at most SHORT_AT_MOST of the longest
    concurrency-1 prompt. Not "shorter than the top step's": the counted prompt drifts a little from step to
    step (the tokenizer splits each request's tag its own way), and a concurrency-1 step a few tokens short
    of the top was read as the short one."""
    if any(role != "ladder" for _, _, role in steps):
        short = next((i for i, (_, _, role) in enumerate(steps) if role == "short"), None)
        long = next((i for i, (_, _, role) in enumerate(steps) if role == "long"), None)
        return short, long
    singles = [(n, i) for i, (c, n, _) in enumerate(steps) if c == 1 and n is not None]
    if len(singles) < 2:
        return None, None
    (fewest, at), longest = min(singles), max(n for n, _ in singles)
    return (at if fewest <= SHORT_AT_MOST * longest else None), None


def split_probes(curve: Sequence[Step]) -> tuple[tuple[Step, ...], Step | None, Step | None]:
    """The ladder (by concurrency), the short step and the long step (`probe_positions`)."""
    ordered = sorted(curve, key=lambda s: s.concurrency)
    short_at, long_at = probe_positions([(s.concurrency, s.prompt_tokens, s.role) for s in ordered])
    probes = {at for at in (short_at, long_at) if at is not None}
    ladder = tuple(s for i, s in enumerate(ordered) if i not in probes)
    return (
        ladder,
        ordered[short_at] if short_at is not None else None,
        ordered[long_at] if long_at is not None else None,
    )


def _prefill_per_token(single: Step | None, short: Step | None, prompt_tokens: int) -> float | None:
    if single is None or single.ttft_p50_ms is None:
        return None
    if short is not None and short.requests > short.failed and short.ttft_p50_ms is not None:
        long_n, short_n = single.prompt_tokens, short.prompt_tokens
        if long_n is not None and short_n is not None and long_n > short_n:
            return round(max(0.0, (single.ttft_p50_ms - short.ttft_p50_ms) / (long_n - short_n)), 4)
    return round(single.ttft_p50_ms / prompt_tokens, 4) if prompt_tokens > 0 else None


def conclude(curve: Sequence[Step], objective_ms: float | None, prompt_tokens: int) -> Measured:
    """The capacity the curve shows (see the module's words). A step with failures ends the search."""
    ladder, short, _ = split_probes(curve)
    if objective_ms is None:
        chosen = _knee(ladder)
    else:
        chosen = None
        for step in ladder:
            if step.failed or step.ttft_p99_ms is None or step.ttft_p99_ms > objective_ms:
                break
            chosen = step
    single = next((s for s in ladder if s.concurrency == 1 and s.requests > s.failed), None)
    return Measured(
        concurrency=chosen.concurrency if chosen else None,
        tokens_per_s=chosen.tokens_per_s if chosen else None,
        prefill_ms_per_token=_prefill_per_token(single, short, prompt_tokens),
        decode_ms_per_token=single.itl_p50_ms if single is not None else None,
        objective_ms=objective_ms,
        curve=tuple(sorted(curve, key=lambda s: s.concurrency)),
    )
