"""A streamed answer screened as it goes: the client's exchange wrapped so every chunk the proxy writes is
read for its generated text, appended to a sliding window (the newest `window_chars` characters plus the new
piece, so a match that spans two events is still seen) and checked by the output guardrails' deterministic
rules. A block ends the client's stream with a final error event and `data: [DONE]`, and raises GuardCut (a
ConnectionResetError) so the proxy drops the upstream as it does for a client that left; a warn is recorded
once and the stream goes on. A judge is not asked per window (an ask per event would cost a judge call per
token): with an output judge the stream is held, judged whole at its end, and only then sent to the client
(or replaced by the refusal event).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.core.errors import LlmgwError
from llmgw.core.evals import guardrails as gr
from llmgw_router.server import sse
from llmgw_router.server.exchange import Exchange, WrappedExchange

__all__ = ["GuardCut", "GuardedStream"]


class GuardCut(LlmgwError, ConnectionResetError):
    """An output guardrail cut the stream (the client has its final error event)."""


class GuardedStream(WrappedExchange):
    """An Exchange that screens what is written through it; everything else is the client's exchange."""

    def __init__(
        self,
        inner: Exchange,
        guards: tuple[gr.CompiledGuardrail, ...],
        on_verdict: Any,
        judge: Callable[[str], Awaitable[gr.Verdict]] | None = None,
    ) -> None:
        super().__init__(inner)
        self.guards = guards
        self.window = max(g.spec.window_chars for g in guards)
        self.tail = ""
        self.verdict: gr.Verdict | None = None  # the strongest found so far (a block ends the stream)
        self._on_verdict = on_verdict  # counts a verdict once (Guard._count)
        self._warned: set[str] = set()
        # With an output judge the stream is held whole, judged, then sent (or replaced by the refusal): a
        # judge reads whole answers, and what a client has seen cannot be taken back (M12).
        self._judge = judge
        self._held: list[bytes] | None = [] if judge is not None else None
        self._head: tuple[int, dict[str, str]] | None = None
        self._answer: list[str] = []

    @property
    def cut(self) -> bool:
        return self.verdict is not None and self.verdict.action == "block"

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        if self._held is not None:
            self._head = (status, headers)
        else:
            self.inner.start_stream(status, headers)

    async def write(self, chunk: bytes, limit_s: float) -> None:
        blocked = self._screen(chunk)
        if blocked:
            await self._release(limit_s)
            await self._end(limit_s)
        if self._held is not None:
            self._held.append(chunk)
            return
        await self.inner.write(chunk, limit_s)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        if last and self._screen(last):
            await self._release(limit_s)
            await self._end(limit_s)
        if self._judge is not None and self._held is not None:
            verdict = await self._judge("".join(self._answer))
            if verdict.action != "pass" and (self.verdict is None or verdict.action == "block"):
                self.verdict = verdict
            if verdict.action == "block":
                await self._release(limit_s, chunks=False)
                await self._end(limit_s)
        await self._release(limit_s)
        await self.inner.write_eof(limit_s, last)

    async def _release(self, limit_s: float, chunks: bool = True) -> None:
        """Send what was held: the stream's head, and the events (none when the judge refused them)."""
        held, self._held = self._held, None
        if self._head is not None:
            self.inner.start_stream(*self._head)
            self._head = None
        for chunk in held if chunks and held else ():
            await self.inner.write(chunk, limit_s)

    def _screen(self, chunk: bytes) -> bool:
        """Read the chunk's text into the window and check it; True when a block trips."""
        piece = "".join(_pieces(chunk))
        if not piece:
            return False
        if self._judge is not None:
            self._answer.append(piece)
        text = self.tail + piece
        self.tail = text[-self.window :]
        findings = [f for g in self.guards for f in gr.scan(g, text, "output")]
        fresh = [f for f in findings if f"{f.guardrail}/{f.rule}" not in self._warned]
        if not fresh:
            return False
        verdict = gr.decide(self.guards, fresh, "output")
        self._warned.update(f"{f.guardrail}/{f.rule}" for f in fresh)
        self._on_verdict(verdict)
        if self.verdict is None or verdict.action == "block":
            self.verdict = verdict
        return verdict.action == "block"

    async def _end(self, limit_s: float) -> None:
        assert self.verdict is not None
        err = {
            "error": {
                "message": gr.refusal_message(self.verdict),
                "type": "invalid_request_error",
                "param": None,
                "code": "guardrail_blocked",
            }
        }
        await self.inner.write_eof(limit_s, sse.format_json(err) + sse.DONE_EVENT)
        raise GuardCut("an output guardrail cut the stream")


def _pieces(chunk: bytes) -> list[str]:
    """The generated text in a chunk of SSE events: chat deltas' content, completions' text."""
    out: list[str] = []
    for raw in sse.split(chunk):
        obj = sse.parse(raw).json()
        choices = obj.get("choices") if isinstance(obj, dict) else None
        for c in choices if isinstance(choices, list) else ():
            if not isinstance(c, dict):
                continue
            delta = c.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else c.get("text")
            if isinstance(text, str):
                out.append(text)
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            out += gr.tool_arguments(calls if isinstance(calls, list) else [])
    return out
