"""`llmgw bench --repeats R`: the stepped load run R times over, between two probes of the engine's speed.

One number per parameter says nothing of how far to trust it: on a shared machine an engine's speed moves by a
third within a quarter of an hour. So the bench runs its whole ladder (and the short and long prompt steps)
R times, each pass after the other, so the passes see the engine at R moments apart: each pass is fitted on
its own and the parameters' intervals are over those fits (`llmgw.core.capacity.engine_spread`); the steps
of all passes pooled make the curve the capacity is read from, as before.

Before the first pass and after the last, the same probe (PROBE_REQUESTS requests one after the other, the
ladder's prompt): where the engine's speed moved between them past its own scatter
(`llmgw.core.capacity.spread.judge_drift`), the bench says so and does not conclude: a fit through a drift
describes neither end, and `--save` stores nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import aiohttp

from llmgw.cli.data.bench_load import bench_session, one_request, prompt_tags, step_samples
from llmgw.core.capacity.bench import Measured, RequestSample, Step, conclude, summarize_step
from llmgw.core.capacity.engine_spread import PARAMETERS, fit_engine_spread, parameters_of
from llmgw.core.capacity.spread import CONFIDENCE, Drift, judge_drift

__all__ = ["PROBE_REQUESTS", "BenchRun", "bench_result", "run_bench_passes", "spread_lines"]

PROBE_REQUESTS = 6  # at each end: two probes of six part by chance once in 460 (spread.judge_drift)


@dataclass(frozen=True)
class BenchRun:
    measured: Measured  # from the pooled steps
    passes: tuple[tuple[Step, ...], ...]  # each pass's steps, `repeat` set
    drift: Drift | None  # None: a probe measured nothing (every request failed)


@dataclass(frozen=True)
class _Plan:
    """What a pass runs, in order: (concurrency, prompt words, role); `request_s`, what one request takes
    alone, staggers a step's workers (`bench_load._step`: started together, llama.cpp batches their prompts)."""

    steps: tuple[tuple[int, int, str], ...]
    request_s: float = 0.0


async def _probe(
    target: dict[str, Any], prompt_tokens: int, max_tokens: int, tags: Iterator[str], requests: int
) -> list[float]:
    """Each probe request's whole time (first token and the rest), in ms, one after the other."""
    out: list[float] = []
    timeout = aiohttp.ClientTimeout(total=120.0)
    async with bench_session(timeout) as session:
        for _ in range(requests):
            started = time.monotonic()
            sample = await one_request(session, target, next(tags), prompt_tokens, max_tokens)
            if sample.ok:
                out.append((time.monotonic() - started) * 1000.0)
    return out


Pooled = dict[tuple[int, str], tuple[list[RequestSample], float]]


async def _pass(
    target: dict[str, Any],
    plan: _Plan,
    seconds: float,
    max_tokens: int,
    tags: Iterator[str],
    k: int,
    pooled: Pooled,
) -> list[Step]:
    out = []
    for n, words, role in plan.steps:
        samples, took = await step_samples(target, n, seconds, words, max_tokens, tags, plan.request_s)
        before, spent = pooled.get((n, role), ([], 0.0))
        pooled[(n, role)] = (before + samples, spent + took)
        out.append(replace(summarize_step(n, samples, took, role), repeat=k))
    return out


def _first_plan(first: list[Step], prompt_tokens: int, request_s: float) -> _Plan:
    """The steps the first pass ran, as the plan of the others."""
    words = {"short": max(1, prompt_tokens // 4), "long": prompt_tokens * 2}
    return _Plan(tuple((s.concurrency, words.get(s.role, prompt_tokens), s.role) for s in first), request_s)


async def _first_pass(
    target: dict[str, Any],
    levels: list[int],
    seconds: float,
    prompt_tokens: int,
    max_tokens: int,
    objective_ms: float | None,
    tags: Iterator[str],
    pooled: Pooled,
    request_s: float,
) -> list[Step]:
    """The ladder as `run_bench` runs it (short and long steps after a concurrency-1 step that served; stop
    at a failure or a miss of the objective)."""
    out: list[Step] = []
    short_words = max(1, prompt_tokens // 4)
    for n in levels:
        plan = _Plan(((n, prompt_tokens, "ladder"),), request_s)
        step = (await _pass(target, plan, seconds, max_tokens, tags, 1, pooled))[0]
        out.append(step)
        if n == 1 and step.requests > step.failed and short_words < prompt_tokens:
            probes = _Plan(((1, short_words, "short"), (1, prompt_tokens * 2, "long")))
            out.extend(await _pass(target, probes, seconds, max_tokens, tags, 1, pooled))
        missed = objective_ms is not None and (step.ttft_p99_ms is None or step.ttft_p99_ms > objective_ms)
        if step.failed or missed:
            break
    return out


async def run_bench_passes(
    target: dict[str, Any],
    levels: list[int],
    seconds: float,
    prompt_tokens: int,
    max_tokens: int,
    objective_ms: float | None,
    repeats: int,
    probe_requests: int = PROBE_REQUESTS,
) -> BenchRun:
    """Warm up, probe, the first pass (it decides the steps), the other passes over the same steps, probe.
    Fewer `probe_requests` cost less on a slow engine and part by chance more often (four a side: once in 35)."""
    tags = prompt_tags()
    timeout = aiohttp.ClientTimeout(total=max(60.0, seconds * 4))
    async with bench_session(timeout) as session:
        await one_request(session, target, next(tags), prompt_tokens, max_tokens)  # pages the weights in
    start = await _probe(target, prompt_tokens, max_tokens, tags, probe_requests)
    pooled: Pooled = {}
    request_s = statistics.median(start) / 1000.0 if start else 0.0
    first = await _first_pass(
        target, levels, seconds, prompt_tokens, max_tokens, objective_ms, tags, pooled, request_s
    )
    plan = _first_plan(first, prompt_tokens, request_s)
    passes = [tuple(first)]
    for k in range(2, repeats + 1):
        passes.append(tuple(await _pass(target, plan, seconds, max_tokens, tags, k, pooled)))
    end = await _probe(target, prompt_tokens, max_tokens, tags, probe_requests)
    curve = [summarize_step(n, samples, took, role) for (n, role), (samples, took) in pooled.items()]
    drift = judge_drift(start, end) if start and end else None
    return BenchRun(conclude(curve, objective_ms, prompt_tokens), tuple(passes), drift)


def bench_result(target: dict[str, Any], goal: float | None, run: BenchRun) -> dict[str, Any]:
    """What `llmgw bench` prints as JSON and posts with `--save`: the pooled conclusion and curve, and each
    pass's steps in the curve too (`repeat` set) where there are two passes or more."""
    measured = run.measured
    per_pass = [asdict(s) for steps in run.passes for s in steps] if len(run.passes) >= 2 else []
    return {
        "model": target["model"],
        "profile": target["profile"],
        "replica": target["replica"],
        "engine": target["engine"],
        "objective_ms": goal,
        "concurrency": measured.concurrency,
        "tokens_per_s": measured.tokens_per_s,
        "prefill_ms_per_token": measured.prefill_ms_per_token,
        "decode_ms_per_token": measured.decode_ms_per_token,
        "load_s": target.get("load_s"),
        "curve": [asdict(s) for s in measured.curve] + per_pass,
    }


def spread_lines(result: dict[str, Any], drift: Drift | None) -> list[str]:
    """The parameters with their intervals over the passes, and the drift check's verdict, in words."""
    lines = []
    if drift is None:
        lines.append("drift: not checked (a probe at the start or the end measured nothing)")
    else:
        lines.append(drift.words())
    if drift is not None and drift.drifted:
        lines.append(
            "not fitted: a fit through a drift describes neither end; not saved. Bench again when steady."
        )
        return lines
    spread = fit_engine_spread(result, None, f"{result['model']}/{result['profile']}")
    if not spread.known:
        lines.append("parameters: one pass, no interval (--repeats 2 or more measures the spread)")
        return lines
    lines.append(
        f"fitted ({CONFIDENCE:.0%} confidence interval of the mean over {len(spread.passes)} passes):"
    )
    pooled = parameters_of(spread.central)
    for name, (words, unit) in PARAMETERS.items():
        i = spread.parameters[name]
        lines.append(f"  {words:<32} {pooled[name]:9.3f} {unit:<3} [{i.low:.3f}, {i.high:.3f}]")
    return lines
