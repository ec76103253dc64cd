"""The client's exchange for a disaggregated request's streamed decode, so a decode that breaks after the client
has bytes can be continued in the same stream (two_steps.py decides how, by the model's `on_failure`).

While the decode streams, the events pass through as they are and are kept (a list append per write: nothing
is parsed unless the stream breaks). The proxy ends a stream that broke without its `data: [DONE]`; that end is
held back here, so the stream stays open for the continuation. The continuation's events then go to the same
stream: its head is not sent again (the client has one), its opening role-only event is dropped, and the rest
are stamped with the first stream's id, creation time and model, its usage counting the first stream's tokens
too (decisions/disagg.py). A stream that cannot be continued, or whose continuation fails too, is ended with an
error event and `data: [DONE]`, as an output guardrail ends one (path/guard_stream.py).

A plain request's stream is not wrapped: nothing of this is on its path.
"""

from __future__ import annotations

from typing import Any

import orjson

from llmgw_router.decisions.disagg import Streamed, continued_event, streamed
from llmgw_router.path.accounting import Call
from llmgw_router.server import sse
from llmgw_router.server.exchange import Exchange, WrappedExchange

__all__ = ["DecodeStream"]


class DecodeStream(WrappedExchange):
    """The client's exchange, around a decode's stream and, when it broke, its continuation's."""

    def __init__(self, inner: Exchange, call: Call) -> None:
        super().__init__(inner)
        self._call = call
        self._kept: list[bytes] = []
        self.head_sent = False  # the stream's head went to the client
        self.end_held = False  # the stream broke: its end was held back (the client's stream is still open)
        self._done: Streamed | None = None  # continuing: what the broken stream had given the client
        self.first_byte_at: float | None = None  # when the client had the broken stream's first bytes

    @property
    def broke(self) -> bool:
        """The client has part of a stream whose engine went before its end."""
        return self.head_sent and self.end_held

    def given(self) -> Streamed:
        """What the broken stream gave the client (read once it broke)."""
        return streamed(sse.parse(raw).json() for raw in sse.split(b"".join(self._kept)))

    def continuing(self, done: Streamed) -> None:
        """What is written from now on continues the stream the client has."""
        result = self._call.result
        self.first_byte_at = result.first_byte_at if result is not None else None
        self._done, self._kept, self.end_held = done, [], False

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        if self._done is None:
            self.head_sent = True
            self.inner.start_stream(status, headers)
            return
        # The continuation's stream started (its result is the call's now): the client has the head already.
        # The result carries the first stream's tokens, so a continuation cut short (the client gone) is still
        # charged both.
        result = self._call.result
        if result is not None:
            result.events += self._done.tokens

    async def write(self, chunk: bytes, limit_s: float) -> None:
        if self._done is not None:
            chunk = _restamped(chunk, self._done)
        else:
            self._kept.append(chunk)
        if chunk:
            await self.inner.write(chunk, limit_s)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        if sse.DONE_LINE in last:
            result = self._call.result
            if self._done is not None:
                last = _restamped(last, self._done)
                if result is not None and result.completion_tokens is not None:
                    # The engine's usage (read before its events were written) counts its own tokens only.
                    result.completion_tokens += self._done.tokens
            await self.inner.write_eof(limit_s, last)
            return
        # Ended without [DONE]: the engine went. Whatever it sent last goes on; the end waits.
        if last:
            await self.write(last, limit_s)
        self.end_held = True

    async def fail(self, limit_s: float, message: str) -> None:
        """End the client's stream with an error event and `data: [DONE]`. A stream translated into another
        API's events has no place for a chat error event: it is ended, and its translation ends it as a
        stream that broke off (the Messages and Responses surfaces' own terminal events)."""
        self.end_held = False
        if self.inner.surface.streams_translated:
            await self.inner.write_eof(limit_s)
            return
        err = {"message": message, "type": "server_error", "param": None, "code": "upstream_unavailable"}
        await self.inner.write_eof(limit_s, sse.format_json({"error": err}) + sse.DONE_EVENT)


def _restamped(block: bytes, done: Streamed) -> bytes:
    """The continuation's events of `block` as the client gets them."""
    out: list[bytes] = []
    for raw in sse.split(block):
        event = sse.parse(raw)
        obj: Any = event.json()
        if not isinstance(obj, dict):
            out.append(raw)  # [DONE], a comment, what is not JSON: as it came
            continue
        stamped = continued_event(obj, done)
        if stamped is not None:
            out.append(sse.format_event(orjson.dumps(stamped), event.name, event.id))
    return b"".join(out)
