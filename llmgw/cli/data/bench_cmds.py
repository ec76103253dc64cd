"""`llmgw bench MODEL` and `llmgw capacity`: measure what one replica serves, and list what is known.

`bench` asks the controller for a ready replica of the model (`GET /api/v1/bench/MODEL`: its address and engine
key, so the run measures the replica and not the router in front of it), drives it with streamed chat requests
at stepped concurrency (1, 2, 4, ... by default), and prints per step the p50/p99 time to first token, the
inter-token latency and tokens/s, then two more steps at concurrency 1 with prompts a quarter and twice as long
(what the prefill costs per prompt token, and how much faster than the prompt it grows, in the tokens the engine
counts); then the capacity at the model's objective (`slo.ttft_p99_ms`, or
`--objective`) as `llmgw.core.capacity.bench.conclude` reads the curve. `--save` stores it (`POST /api/v1/capacity`) and
the autoscaler uses it from then on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Annotated, Any

import aiohttp
import typer
from rich.table import Table

from llmgw.cli import output
from llmgw.cli.admin_client import AdminError
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client, fail
from llmgw.core.capacity.bench import Measured, RequestSample, Step, conclude, summarize_step

MAX_REPEATS = 6
MAX_CURVE = 64  # steps the controller stores per measurement (api/capacity.py)

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("capacity")(capacity)


def bench_prompt(tokens: int, tag: str) -> str:
    # The request's tag leads, so no two prompts share more than the chat template's prefix and a prefix
    # cache (whose every block hangs on the blocks before it) does not turn the measurement into one of cache
    # hits. Only the first word carries it: in every word it tripled the tokens per word.
    return " ".join([tag, *(f"w{k}x{k}" for k in range(tokens - 1))])


def prompt_tags() -> Iterator[str]:
    """Tags unique to this run and across its steps. llama-server keeps earlier prompts' KV in host memory
    (its prompt cache), so a step that numbered its prompts from 0 again was served the previous step's
    prefills from that cache (seen: 160 ms at concurrency 2 for a prompt that took 1.7 s alone), and so was a
    second bench against the same server."""
    run = secrets.token_hex(3)
    return (f"{run}n{i:05d}" for i in itertools.count())  # one width: the prompt keeps its length


async def one_request(
    session: aiohttp.ClientSession, target: dict[str, Any], tag: str, prompt_tokens: int, max_tokens: int
) -> RequestSample:
    body = {
        "model": target["model"],
        "messages": [{"role": "user", "content": bench_prompt(prompt_tokens, tag)}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # every answer runs to max_tokens (vLLM, llama.cpp, sim): the step's load is known
        "stream": True,
        "stream_options": {"include_usage": True},  # the prompt tokens the engine counted
    }
    headers = {"Authorization": f"Bearer {target['api_key']}"}
    started = time.monotonic()
    stamps: list[float] = []
    counted: int | None = None
    try:
        async with session.post(
            target["base_url"].rstrip("/") + "/v1/chat/completions", json=body, headers=headers
        ) as r:
            if r.status != 200:
                return RequestSample(0.0, (), 0, ok=False)
            async for raw in r.content:
                line = raw.strip()
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    chunk = _chunk(line[6:])
                    if chunk.get("choices") != []:  # the usage chunk carries no token
                        stamps.append(time.monotonic())
                    counted = _prompt_tokens(chunk) or counted
    except (aiohttp.ClientError, TimeoutError):
        return RequestSample(0.0, (), 0, ok=False)
    if not stamps:
        return RequestSample(0.0, (), 0, ok=False)
    gaps = tuple(b - a for a, b in itertools.pairwise(stamps))
    return RequestSample(stamps[0] - started, gaps, len(stamps), prompt_tokens=counted)


def _chunk(data: bytes) -> dict[str, Any]:
    try:
        found = json.loads(data)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _prompt_tokens(chunk: dict[str, Any]) -> int | None:
    usage = chunk.get("usage")
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) and count > 0 else None


def bench_session(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    # A connection per request: llama-server closes a kept-alive connection under a client about to reuse
    # it (seen here: "Server disconnected" on a streamed request's second use), and a failed request ends the
    # bench's ladder. A loopback connect costs nothing beside a completion.
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True))


async def _step(
    target: dict[str, Any],
    concurrency: int,
    seconds: float,
    prompt_tokens: int,
    max_tokens: int,
    tags: Iterator[str],
    role: str = "ladder",
    request_s: float = 0.0,
) -> Step:
    """One step's closed loop. Its workers start `request_s / concurrency` apart: started together they stay
    in lockstep, and llama.cpp then prefills each round's prompts in one batch (two 392-token prompts in
    3.2 s where one alone took 2.2 s), which traffic arriving on its own schedule seldom gets, so the step
    measured a replica faster than the one a trace meets."""
    samples, took = await step_samples(
        target, concurrency, seconds, prompt_tokens, max_tokens, tags, request_s
    )
    return summarize_step(concurrency, samples, took, role)


async def step_samples(
    target: dict[str, Any],
    concurrency: int,
    seconds: float,
    prompt_tokens: int,
    max_tokens: int,
    tags: Iterator[str],
    request_s: float = 0.0,
) -> tuple[list[RequestSample], float]:
    """One step's closed loop (`_step`'s words): its requests' samples and how long its workers ran, in
    seconds: the mean of each worker's span from its first request to its last answer. Not the step's whole
    span: a worker that starts later by the stagger was not offering load meanwhile, and counting that time
    (a third of a short step at concurrency 2 on a sim) read as the replica completing less than it does."""
    samples: list[RequestSample] = []
    spans: list[float] = []
    deadline = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession, k: int) -> None:
        await asyncio.sleep(k * request_s / concurrency)
        began = time.monotonic()
        while time.monotonic() < deadline:
            samples.append(await one_request(session, target, next(tags), prompt_tokens, max_tokens))
        spans.append(time.monotonic() - began)

    timeout = aiohttp.ClientTimeout(total=max(60.0, seconds * 4))
    async with bench_session(timeout) as session:
        await asyncio.gather(*(worker(session, k) for k in range(concurrency)))
    return samples, sum(spans) / len(spans)


async def run_bench(
    target: dict[str, Any],
    steps: list[int],
    seconds: float,
    prompt_tokens: int,
    max_tokens: int,
    objective_ms: float | None,
) -> Measured:
    """Drive the target at each concurrency in turn (after one request that warms it up); stop early once a
    step misses the objective or fails. After a concurrency-1 step that served, one more with prompts a
    quarter as long (the short step) and one with prompts twice as long (the long step)."""
    curve: list[Step] = []
    tags = prompt_tags()
    # One request first, not measured: an engine that just started pays for paging its weights in (llama.cpp
    # maps the file) and would have the first step look slower than any that follows.
    timeout = aiohttp.ClientTimeout(total=max(60.0, seconds * 4))
    async with bench_session(timeout) as session:
        warm = time.monotonic()
        await one_request(session, target, next(tags), prompt_tokens, max_tokens)
        request_s = time.monotonic() - warm  # what one request takes, until a concurrency-1 step says better
    for n in steps:
        step = await _step(target, n, seconds, prompt_tokens, max_tokens, tags, request_s=request_s)
        curve.append(step)
        if n == 1 and step.requests > step.failed:
            request_s = step.seconds / (step.requests - step.failed)
        short_words = max(1, prompt_tokens // 4)
        if n == 1 and step.requests > step.failed and short_words < prompt_tokens:
            curve.append(await _step(target, 1, seconds, short_words, max_tokens, tags, "short"))
            # Twice the prompt as well: with three lengths the fit sees the cost grow faster than the
            # prompt (attention). A step past the model's context fails and is left out of the fit.
            curve.append(await _step(target, 1, seconds, prompt_tokens * 2, max_tokens, tags, "long"))
        missed = objective_ms is not None and (step.ttft_p99_ms is None or step.ttft_p99_ms > objective_ms)
        if step.failed or missed:
            break
    return conclude(curve, objective_ms, prompt_tokens)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def bench(
    model: Annotated[str, typer.Argument(help="Model (or alias) whose replica to measure")],
    profile: Annotated[
        str | None, typer.Option("--profile", help="Measure a replica of this profile")
    ] = None,
    save: Annotated[bool, typer.Option("--save", help="Store the result for the autoscaler")] = False,
    steps: Annotated[
        str, typer.Option("--steps", help="Concurrency steps, comma-separated")
    ] = "1,2,4,8,16,32",
    step_time: Annotated[float, typer.Option("--step-seconds", help="How long each step runs")] = 10.0,
    objective: Annotated[
        float | None, typer.Option("--objective", help="p99 TTFT objective in ms (default: the model's slo)")
    ] = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt length, in words")] = 128,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Completion tokens per request")] = 64,
    repeats: Annotated[
        int,
        typer.Option(
            "--repeats",
            min=1,
            max=MAX_REPEATS,
            help="Passes over the steps: each parameter's interval is over the passes' fits",
        ),
    ] = 3,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure one replica under stepped concurrency: TTFT and inter-token latency per step, and its capacity."""
    levels = _levels(steps, repeats)
    from llmgw.cli.data.bench_passes import bench_result, run_bench_passes, spread_lines

    client = controller_client(controller, token_file)
    query = f"?profile={profile}" if profile else ""
    target = client.get(f"/api/v1/bench/{model}{query}")
    goal = objective if objective is not None else target.get("objective_ms")
    run = asyncio.run(run_bench_passes(target, levels, step_time, prompt_tokens, max_tokens, goal, repeats))
    result = bench_result(target, goal, run)
    drifted = run.drift is not None and run.drift.drifted
    if save and not drifted:
        try:
            client.post("/api/v1/capacity", result)
        except AdminError as exc:  # the run cost its time already: print it, say the save failed
            output.console(stderr=True).print(f"[yellow]not saved:[/yellow] {exc}", highlight=False)
    if as_json:
        output.print_json({**result, "drift": None if run.drift is None else asdict(run.drift)})
    else:
        _print_bench(result, target, save and not drifted, fitted=not drifted)
        for line in spread_lines(result, run.drift):
            output.console().print(line, highlight=False)
    raise typer.Exit(1 if drifted else 0)  # a drifted engine: the run measured nothing to act on


def _levels(steps: str, repeats: int) -> list[int]:
    """--steps as the concurrencies to run, checked (with --repeats, against what the controller stores)."""
    try:
        levels = sorted({int(s) for s in steps.split(",") if s.strip()})
    except ValueError:
        fail(f"--steps {steps!r}: expected whole numbers separated by commas, e.g. 1,2,4,8")
    if not levels or levels[0] < 1:
        fail(f"--steps {steps!r}: every step is at least 1")
    if (len(levels) + 2) * (repeats + 1) > MAX_CURVE:
        fail(f"--steps {steps!r} with --repeats {repeats}: over {MAX_CURVE} steps to store; fewer of either")
    return levels


def _print_bench(result: dict[str, Any], target: dict[str, Any], saved: bool, fitted: bool = True) -> None:
    console = output.console()
    where = f" on {target['gpu_class']}" if target.get("gpu_class") else ""
    console.print(
        f"{result['model']}/{result['profile']} ({result['engine']}{where}), replica {result['replica']}",
        highlight=False,
    )
    table = Table(
        "CONCURRENCY",
        "PROMPT",
        "REQUESTS",
        "FAILED",
        "TTFT P50",
        "TTFT P99",
        "ITL P50",
        "ITL P99",
        "TOKENS/S",
    )
    for s in result["curve"]:
        if s.get("repeat") is not None:  # one pass's share: its spread is printed after the table
            continue
        probe = f" ({s['role']})" if s.get("role", "ladder") != "ladder" else ""
        table.add_row(
            str(s["concurrency"]) + probe,
            _ms(s.get("prompt_tokens")),
            str(s["requests"]),
            str(s["failed"]),
            _ms(s["ttft_p50_ms"]),
            _ms(s["ttft_p99_ms"]),
            _ms(s["itl_p50_ms"]),
            _ms(s["itl_p99_ms"]),
            f"{s['tokens_per_s']:.1f}",
        )
    console.print(table)
    if not fitted:
        return
    goal = result["objective_ms"]
    against = f"p99 TTFT under {goal:g} ms" if goal is not None else "no objective: the throughput knee"
    cap = result["concurrency"]
    words = (
        "not one sequence met it"
        if cap is None
        else f"{cap} concurrent, {result['tokens_per_s']:.1f} tokens/s"
    )
    console.print(f"capacity ({against}): {words}", highlight=False)
    console.print(
        f"prefill {_ms(result['prefill_ms_per_token'])} ms/token, decode "
        f"{_ms(result['decode_ms_per_token'])} ms/token, load {result['load_s'] or '-'} s"
        + (" (saved)" if saved else ""),
        highlight=False,
    )


def capacity(controller: ControllerOpt = None, token_file: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Per model and profile: the measured capacity and when, else what is assumed (slots), else unknown."""
    data = controller_client(controller, token_file).get("/api/v1/capacity")
    if as_json:
        output.print_json(data)
        return
    table = Table(
        "MODEL", "PROFILE", "GPU CLASS", "SOURCE", "CONCURRENT", "TOKENS/S", "OBJECTIVE", "MEASURED"
    )
    now = time.time()
    for row in data.get("capacity", []):
        m = row.get("measured")
        if m is not None:
            conc = "-" if m["concurrency"] is None else str(m["concurrency"])
            tps = "-" if m["tokens_per_s"] is None else f"{m['tokens_per_s']:.1f}"
            goal = "-" if m["objective_ms"] is None else f"{m['objective_ms']:g} ms"
            when = f"{int((now - m['measured_at']) // 60)}m ago"
        else:
            conc = "-" if row["assumed_slots"] is None else f"{row['assumed_slots']} (slots)"
            tps, goal, when = "-", "-", "never"
        table.add_row(
            row["model"], row["profile"], row["gpu_class"] or "cpu", row["source"], conc, tps, goal, when
        )
    output.console().print(table)
