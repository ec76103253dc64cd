"""What `llmgw bench` sends: the prompts (distinct per request, so no engine serves one from its prefix cache),
one streamed request and what it measured, a step of concurrent workers, and the stepped run `bench` drives
(`run_bench`). The passes with their spread (llmgw.cli.data.bench_passes) drive the same steps; both import
them from here, and the command (llmgw.cli.data.bench_cmds) imports both."""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import aiohttp

from llmgw.core.capacity.bench import Measured, RequestSample, Step, conclude, summarize_step

__all__ = ["bench_prompt", "bench_session", "one_request", "prompt_tags", "run_bench", "step_samples"]


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
    completion: int | None = None
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
                    counted = _usage_count(chunk, "prompt_tokens") or counted
                    completion = _usage_count(chunk, "completion_tokens") or completion
    except (aiohttp.ClientError, TimeoutError):
        return RequestSample(0.0, (), 0, ok=False)
    if not stamps:
        return RequestSample(0.0, (), 0, ok=False)
    gaps = tuple(b - a for a, b in itertools.pairwise(stamps))
    return RequestSample(
        stamps[0] - started, gaps, len(stamps), prompt_tokens=counted, completion_tokens=completion
    )


def _chunk(data: bytes) -> dict[str, Any]:
    try:
        found = json.loads(data)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _usage_count(chunk: dict[str, Any], field: str) -> int | None:
    usage = chunk.get("usage")
    count = usage.get(field) if isinstance(usage, dict) else None
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
