"""The sim engine's parts that are not its HTTP handlers: its counters (`SimStats`), its slots (`FifoSlots`,
strictly first come first served), one request's work (`Work`), and what it gets wrong on purpose
(`Behaviour`).
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from llmgw_agent.sim_model import Timing, ToolCall

__all__ = [
    "PROBES",
    "TTFT_BUCKETS",
    "Behaviour",
    "FifoSlots",
    "SimStats",
    "Work",
    "openai_error",
    "tool_call_obj",
]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


def openai_error(status: int, message: str, type_: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return web.json_response(body, status=status)


@dataclass
class SimStats:
    running: int = 0
    kv_tokens: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    ttft_sum: float = 0.0
    ttft_count: int = 0

    def observe_ttft(self, seconds: float) -> None:
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self.ttft_counts[i] += 1
        self.ttft_sum += seconds
        self.ttft_count += 1

    def ttft_histogram(self, labels: str) -> list[str]:
        """The time-to-first-token histogram as vLLM's /metrics shows it."""
        name = "vllm:time_to_first_token_seconds"
        lines = [f"# HELP {name} Histogram of time to first token in seconds.", f"# TYPE {name} histogram"]
        for bound, count in zip(TTFT_BUCKETS, self.ttft_counts, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(count)!r}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.ttft_count)!r}')
        lines.append(f"{name}_count{{{labels}}} {float(self.ttft_count)!r}")
        lines.append(f"{name}_sum{{{labels}}} {self.ttft_sum!r}")
        return lines


class FifoSlots:
    """At most `limit` holders; waiters are admitted strictly in arrival order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def acquire(self) -> None:
        if self.held < self.limit and not self._queue:
            self.held += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut in self._queue:
                self._queue.remove(fut)
            elif fut.done() and not fut.cancelled():
                self.release()  # admitted and cancelled at once: hand the slot on
            raise

    def release(self) -> None:
        while self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes straight to the next waiter
                return
        self.held -= 1


@dataclass
class Work:
    prompt: list[str]
    max_tokens: int  # the longest answer it may get: what it holds of the KV cache
    timing: Timing | None = None
    queue_ms: float = 0.0
    started: float = 0.0
    salt: str | None = None  # vLLM's cache_salt: an extra key of the first block's hash
    token_due: float = 0.0  # when the next decoded token is due on the engine's own clock (see decode_one)
    remote_kv: int = 0  # prompt tokens whose KV a prefill engine handed over (sim_pd.py)


PROBES = ("tools", "response_format", "stream_usage")


@dataclass(frozen=True)
class Behaviour:
    """What the sim gets right or wrong on purpose, for canaries, evals and model checks to find:
    `error_rate` of the chat/completion requests answered 503; `answers` (key, text): a chat whose last
    message contains key is answered text; `fail_probes`: tools answered in words, response_format
    ignored, stream usage never sent."""

    error_rate: float = 0.0
    answers: tuple[tuple[str, str], ...] = ()
    fail_probes: frozenset[str] = frozenset()


def tool_call_obj(call: ToolCall) -> dict[str, Any]:
    """A tool call as the chat API's message shows it."""
    return {"id": call[0], "type": "function", "function": {"name": call[1], "arguments": call[2]}}
