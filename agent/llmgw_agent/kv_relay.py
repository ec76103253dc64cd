"""The KV-event relay: an engine's KV-cache events, read from its publisher on 127.0.0.1, served to routers behind
the pass-through's key check (docs/security.md, H8).

vLLM's publisher (`--kv-events-config`, zmq) has no authentication option, and its events carry the token ids of
every prompt and every generated block. So the agent binds it to 127.0.0.1 only, and the pass-through, which
already checks the engine key on every path, answers `GET /llmgw/kv-events` with what the publisher sends. Each
request is one subscription of its own (a ZMTP connection, zmtp.py): the publisher fans out and drops at its
high-water mark for a slow reader, exactly as it does for a router subscribed to it directly.

The stream is a sequence of records: a 4-byte big-endian length, then that many bytes holding the message's
parts, each a 4-byte big-endian length and its bytes (vLLM's `[topic, seq, msgpack batch]` passes through
untouched). A record of length 0 is a heartbeat, sent after HEARTBEAT_S without an event, so a router can tell a
quiet engine from a dead connection. A message over MAX_MESSAGE_BYTES ends the stream (the router reconnects and
sees the gap in the sequence numbers); it is never read whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from aiohttp import web

from llmgw_agent.zmtp import LocalSubscriber, PublisherError

__all__ = [
    "CONTENT_TYPE",
    "HEARTBEAT",
    "MAX_MESSAGE_BYTES",
    "RELAY_PATH",
    "KvEventRelay",
    "encode_record",
]

log = logging.getLogger(__name__)

RELAY_PATH = "/llmgw/kv-events"
CONTENT_TYPE = "application/x-llmgw-kv-events"
# A batch is one engine step's events: even a 128k-token prefill stored at once is well under 2 MiB of msgpack.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
HEARTBEAT_S = 10.0
HEARTBEAT = bytes(4)
# One subscription per router process is the expected load; the cap bounds what key holders can open.
MAX_SUBSCRIBERS = 64
_PUBLISHER_HOST = "127.0.0.1"


def encode_record(parts: list[bytes]) -> bytes:
    body = b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    return len(body).to_bytes(4, "big") + body


def _refusal(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "kv_events_unavailable"}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


class KvEventRelay:
    """Serves the publisher on 127.0.0.1:`port` to each (already authorized) GET, one subscription each."""

    def __init__(
        self,
        port: int,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        heartbeat_s: float = HEARTBEAT_S,
        max_subscribers: int = MAX_SUBSCRIBERS,
    ) -> None:
        self.port = port
        self.max_message_bytes = max_message_bytes
        self.heartbeat_s = heartbeat_s
        self.max_subscribers = max_subscribers
        self.active = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return _refusal(405, f"{RELAY_PATH} is read with GET")
        if self.active >= self.max_subscribers:
            return _refusal(503, f"this replica already relays its KV events to {self.active} subscribers")
        self.active += 1
        try:
            try:
                sub = await LocalSubscriber.connect(_PUBLISHER_HOST, self.port, self.max_message_bytes)
            except (OSError, TimeoutError, PublisherError) as exc:
                return _refusal(
                    503, f"the engine's KV-event publisher ({_PUBLISHER_HOST}:{self.port}): {exc}"
                )
            try:
                response = web.StreamResponse(
                    headers={"Content-Type": CONTENT_TYPE, "Cache-Control": "no-store"}
                )
                await response.prepare(request)
                await self._pump(sub, response)
                return response
            finally:
                sub.close()
        finally:
            self.active -= 1

    async def _pump(self, sub: LocalSubscriber, response: web.StreamResponse) -> None:
        """Copy messages into records until the publisher's stream or the subscriber's connection ends."""
        pending: asyncio.Task[list[bytes]] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(sub.message())
                done, _ = await asyncio.wait({pending}, timeout=self.heartbeat_s)
                record = HEARTBEAT
                if done:
                    parts, pending = pending.result(), None
                    record = encode_record(parts)
                await response.write(record)
        except PublisherError as exc:
            log.info("KV-event relay %s: the stream ends: %s", self.port, exc)
        except ConnectionError:
            pass  # the subscriber went away
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, PublisherError):
                    await pending
