"""`POST /v1/messages` on the chat path: an Exchange that translates on the way in and out.

The request service serves the chat completions request this exchange's body translates to, with everything
chat has (auth, limits, scheduling, fallbacks, accounting from the engine's usage); the translation happens
where the bytes cross: `read_body` hands the service the chat body, `respond` turns a chat answer or any
refusal into Anthropic's shape, and a stream's chat events become Anthropic's events as they are written.
`x-api-key` stands in for `Authorization: Bearer` when the latter is absent; `anthropic-version` is accepted
and not required (nothing here depends on it).
"""

from __future__ import annotations

import json

from llmgw_router.decisions.fields import DROPPED_HEADER
from llmgw_router.decisions.rules import parse
from llmgw_router.server.errors import ApiError
from llmgw_router.server.exchange import Exchange, Headers, HttpReply, Surface, WrappedExchange
from llmgw_router.surfaces.messages.translate import (
    MessagesStreamTranslator,
    anthropic_error,
    error_to_anthropic,
    from_chat,
    to_chat,
)

__all__ = ["MessagesExchange"]


_MESSAGES = Surface("messages", streams_translated=True)


class MessagesExchange(WrappedExchange):
    """Wraps the client's exchange for the chat path; anything else is the wrapped exchange's."""

    def __init__(self, inner: Exchange) -> None:
        super().__init__(inner)
        self.surface = _MESSAGES
        api_key = inner.headers.get("x-api-key")
        if api_key and "authorization" not in inner.headers:
            self.headers = Headers(inner.headers)
            dict.__setitem__(self.headers, "authorization", f"Bearer {api_key}")
        self._stops: tuple[str, ...] = ()
        self._dropped: tuple[str, ...] = ()
        self._stream: MessagesStreamTranslator | None = None

    async def read_body(self, limit: int) -> bytes:
        """The chat body for the client's Messages body (400 in Anthropic's words when it cannot be one)."""
        translated = to_chat(parse(await self.inner.read_body(limit)))
        self._stops, self._dropped = translated.stop_sequences, translated.dropped
        return json.dumps(translated.chat).encode()

    def _headers(self, headers: dict[str, str]) -> dict[str, str]:
        out = dict(headers)
        if self._dropped:
            named = [*self._dropped, *filter(None, out.get(DROPPED_HEADER, "").split(","))]
            out[DROPPED_HEADER] = ",".join(named)
        return out

    def respond(self, reply: HttpReply) -> None:
        headers = self._headers(reply.headers)
        headers["Content-Type"] = "application/json"
        status, body = reply.status, reply.body
        if status == 200:
            try:
                message = from_chat(json.loads(body), self._stops, reply.headers.get("x-llmgw-model"))
            except ApiError as err:
                status, message = err.status, anthropic_error(err.status, err.message)
            except (ValueError, AttributeError, TypeError):
                status, message = 502, anthropic_error(502, "The engine's answer is not a chat completion.")
        else:
            message = error_to_anthropic(status, body)
        if status != 200:
            # Anthropic's error bodies name their request (null allowed); ours is what `llmgw request` finds.
            message["request_id"] = reply.headers.get("x-request-id")
        self.inner.respond(HttpReply(status, json.dumps(message).encode(), headers))

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        self._stream = MessagesStreamTranslator(self._stops, headers.get("x-llmgw-model"))
        self.inner.start_stream(status, self._headers(headers))

    async def write(self, chunk: bytes, limit_s: float) -> None:
        assert self._stream is not None, "start_stream comes first"
        out = self._stream.feed(chunk)
        if out:
            await self.inner.write(out, limit_s)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        assert self._stream is not None, "start_stream comes first"
        await self.inner.write_eof(limit_s, self._stream.feed(last) + self._stream.finish())
