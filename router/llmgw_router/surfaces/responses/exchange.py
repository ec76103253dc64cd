"""`POST /v1/responses` on the request path: the client's exchange wrapped, so the chat answer an engine gives
reaches the client as the Responses API's (whole, or event by event), while everything else on the path
(auth, limits, scheduling, the proxy, accounting) sees an ordinary chat request.

`ResponsesTurn` holds both forms of the request and decides per endpoint which one it is sent: engines that
serve /v1/responses themselves (responses.NATIVE_ENGINES, from the endpoint's engine kind in the snapshot) get
the client's body as it came and their answer goes back untouched; every other engine and every provider gets
the chat translation. A turn that keeps or continues a stored response (surfaces/responses/kept.py) is always
translated: the router keeps what it answered, so it must see it, and no engine's own store holds content
outside the sealed vault.

A kept response is kept before the client has it: a whole answer is held until `flush` kept it, a stream's
terminal event is sent once the stream's output is kept. A client that retrieves or continues it next never
races the store; the Response's `store` says false when keeping failed.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import replace
from typing import Any

from llmgw.core.snapshot import Tenants
from llmgw_router.server import sse
from llmgw_router.server.exchange import Exchange, HttpReply, Surface, WrappedExchange, json_reply
from llmgw_router.surfaces.responses.keeper import ResponseKeeper
from llmgw_router.surfaces.responses.kept import (
    NO_STORAGE,
    continued_input,
    input_items,
    kept_record,
    plan_storage,
)
from llmgw_router.surfaces.responses.stream import ResponsesStreamTranslator
from llmgw_router.surfaces.responses.translate import NATIVE_ENGINES, ResponseIds, from_chat, to_chat

__all__ = ["ResponsesExchange", "ResponsesTurn"]


class ResponsesTurn:
    def __init__(self, keeper: ResponseKeeper | None = None) -> None:
        self.keeper = keeper
        self.storage = NO_STORAGE
        self.project = ""
        self.history: list[dict[str, Any]] = []  # the stored conversation this turn continues
        self.original: dict[str, Any] = {}
        self.original_raw = b""
        self.chat: dict[str, Any] = {}
        self.chat_raw = b""
        self.ids = ResponseIds("resp_", 0)
        self.translated = True

    def begin(self, body: dict[str, Any], raw: bytes, request_id: str) -> tuple[dict[str, Any], bytes]:
        """Translate the parsed request (400 when it cannot be); the chat form is what the path sizes."""
        self.original, self.original_raw = body, raw
        self.chat = to_chat(body)
        self.chat_raw = json.dumps(self.chat).encode()
        self.ids = ResponseIds.of(request_id, int(time.time()))
        return self.chat, self.chat_raw

    async def bind(self, project: str | None, tenants: Tenants) -> tuple[dict[str, Any], bytes]:
        """Once the key's project is known: what the turn keeps and continues (a 400 when it cannot),
        and the chat form with the stored conversation prepended. No store round trip unless it continues one."""
        spec = tenants.projects.get(project) if project is not None else None
        retention = spec.retention if spec is not None else None
        self.storage = plan_storage(self.original, project, retention, self.keeper is not None)
        if not self.storage.used or project is None or self.keeper is None:
            return self.chat, self.chat_raw
        self.project = project
        # A kept response's id is random, not the request id a client may choose (and reuse).
        self.ids = replace(
            self.ids,
            response="resp_" + secrets.token_hex(24),
            store=self.storage.ttl_s is not None,
            previous=self.storage.previous,
        )
        if self.storage.previous is not None:
            record = await self.keeper.load(project, self.storage.previous, "previous_response_id")
            self.history = continued_input(record, None)
            expanded = {**self.original, "input": [*self.history, *input_items(self.original.get("input"))]}
            self.chat = to_chat(expanded)
            self.chat_raw = json.dumps(self.chat).encode()
        return self.chat, self.chat_raw

    async def keep(self, response: dict[str, Any]) -> None:
        """Keep the answered Response (when the turn keeps one); its `store` says whether that worked."""
        ttl = self.storage.ttl_s
        if ttl is None or self.keeper is None:
            return
        record = kept_record(self.history, self.original.get("input"), response)
        response["store"] = await self.keeper.keep(self.project, self.ids.response, record, ttl)

    def for_engine(self, engine: str | None) -> tuple[str, bytes, dict[str, Any]]:
        """The kind, bytes and body one endpoint is sent (`engine` None: a provider, which is translated)."""
        self.translated = engine not in NATIVE_ENGINES or self.storage.used
        if self.translated:
            return "chat", self.chat_raw, self.chat
        return "responses", self.original_raw, self.original


_RESPONSES = Surface("responses", cacheable=False, redacts_in_place=False, streams_translated=True)


class ResponsesExchange(WrappedExchange):
    """An Exchange that translates the chat answer written through it (when its turn was translated)."""

    def __init__(self, inner: Exchange, keeper: ResponseKeeper | None = None) -> None:
        super().__init__(inner)
        self.surface = _RESPONSES
        self.turn = ResponsesTurn(keeper)
        self._held: HttpReply | None = None  # a whole answer to keep before it is sent (flush)
        self._held_response: dict[str, Any] = {}
        self._stream: ResponsesStreamTranslator | None = None
        self._pending: list[bytes] = []
        self._reader = sse.EventReader()

    def respond(self, reply: HttpReply) -> None:
        if self.turn.translated and reply.status == 200:
            try:
                chat = json.loads(reply.body)
            except ValueError:
                chat = None
            if isinstance(chat, dict):
                obj = from_chat(chat, self.turn.original, self.turn.ids)
                headers = {k: v for k, v in reply.headers.items() if k.lower() != "content-type"}
                if self.turn.storage.ttl_s is not None:
                    self._held, self._held_response = HttpReply(200, b"", headers), obj
                    return
                reply = json_reply(obj, 200, headers)
        self.inner.respond(reply)

    async def flush(self) -> None:
        """Keep a held answer, then send it (the route's handler calls this once the request path ended)."""
        held, self._held = self._held, None
        if held is None:
            return
        await self.turn.keep(self._held_response)
        self.inner.respond(json_reply(self._held_response, 200, held.headers))

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        if self.turn.translated and status == 200:
            model = str(self.turn.original.get("model", ""))
            self._stream = ResponsesStreamTranslator(self.turn.original, self.turn.ids, model)
            self._pending = self._stream.start()
        self.inner.start_stream(status, headers)

    def _translate(self, chunk: bytes, end: bool = False) -> bytes:
        """The Responses events for these chat events (`end`: the stream ended, an incomplete one included)."""
        stream = self._stream
        assert stream is not None
        out, self._pending = self._pending, []
        events = self._reader.feed(chunk)
        if end and (rest := self._reader.take_pending()).strip():
            events.append(rest)
        for raw in events:
            event = sse.parse(raw)
            if event.done:
                if self.turn.storage.ttl_s is None:  # a kept stream ends in write_eof, once kept
                    out += stream.finish()
                continue
            obj = event.json()
            if isinstance(obj, dict):
                out += stream.feed(obj)
        return b"".join(out)

    async def write(self, chunk: bytes, limit_s: float) -> None:
        if self._stream is None:
            await self.inner.write(chunk, limit_s)
            return
        out = self._translate(chunk)
        if out:
            await self.inner.write(out, limit_s)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        if self._stream is None:
            await self.inner.write_eof(limit_s, last)
            return
        out = self._translate(last, end=True)
        # A stream that broke off without [DONE] still ends in a terminal event (response.failed).
        if self._stream.done:
            await self.inner.write_eof(limit_s, out)
            return
        closing, kind, response = self._stream.ending()
        await self.turn.keep(response)  # what was streamed, kept before the client hears it ended
        out += b"".join(closing) + self._stream.terminal(kind, response)
        await self.inner.write_eof(limit_s, out)
