"""The end of a stream: the router ends the client's answer at `data: [DONE]`, and a client that hangs up right
after it is accounted as served, with its usage, not as a request cut short.

The engine here is a raw loopback server so the test decides when its bytes go out: it sends the events and
[DONE], then holds back the end of its chunked message until told.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.service import Router, RouterOptions
from support import wait_for

from llmgw.adapters.keys import hash_key
from llmgw.core.snapshot import RouterSnapshot
from llmgw.store.records import UsageRecord

KEY = "sk-llmgw-" + "e" * 43
DEADLINE_S = 10.0


def _event(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


EVENTS = [
    _event(
        {
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "hi"}}],
        }
    ),
    _event(
        {
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
        }
    ),
    b"data: [DONE]\n\n",
]


class HoldingEngine:
    """Answers a streaming chat with EVENTS, then waits for `finish` before ending its chunked message."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()
        self.before: list[bytes] = EVENTS  # sent at once
        self.after: list[bytes] = []  # sent once `finish` is set
        self.port = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if head.startswith(b"GET /metrics"):
                    body = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                for event in self.before:
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await writer.drain()
                await self.finish.wait()
                for event in self.after:
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> HoldingEngine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.finish.set()
        assert self.server is not None
        self.server.close()


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, list[UsageRecord], HoldingEngine]]:
    records: list[UsageRecord] = []

    class Sink:
        def record(self, rec: UsageRecord) -> None:
            records.append(rec)

    async with HoldingEngine() as engine:
        router = Router(
            RouterOptions(),
            Authenticator(StaticKeys.from_file_lines([f"{hash_key(KEY)} p1 key-1"])),
            usage=Sink(),
        )
        router.apply_snapshot(
            RouterSnapshot.model_validate(
                {
                    "revision": "r1",
                    "models": {
                        "m": {
                            "context_length": 2048,
                            "capabilities": ["chat"],
                            "prices": {"input_per_million": 1.0, "output_per_million": 2.0},
                        }
                    },
                    "tenants": {"organizations": {"o": {}}, "projects": {"p1": {"organization": "o"}}},
                    "endpoints": [
                        {
                            "replica_id": "e1",
                            "model": "m",
                            "engine": "vllm",
                            "base_url": f"http://127.0.0.1:{engine.port}",
                            "api_key": "engine-key",
                        }
                    ],
                }
            )
        )
        listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
        try:
            yield f"http://127.0.0.1:{listeners.api_port}/v1/chat/completions", records, engine
        finally:
            await listeners.close()


async def _read_to_done(resp: aiohttp.ClientResponse) -> bytes:
    seen = b""
    while b"data: [DONE]" not in seen:
        chunk = await resp.content.readany()
        assert chunk, f"the stream ended before [DONE]: {seen!r}"
        seen += chunk
    return seen


BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "x"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def test_the_answer_ends_at_done_without_waiting_for_the_engines_last_bytes(
    gateway: tuple[str, list[UsageRecord], HoldingEngine],
) -> None:
    url, records, _engine = gateway
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=BODY, headers={"Authorization": f"Bearer {KEY}"}) as resp:
            seen = await _read_to_done(resp)
            assert b'"usage"' in seen
            # The engine still holds back the end of its message; the client's answer is complete anyway.
            assert await asyncio.wait_for(resp.content.read(), DEADLINE_S) == b""
        await wait_for(lambda: records, DEADLINE_S, "the request accounted")
    assert (records[0].status, records[0].tokens_in, records[0].tokens_out) == (200, 12, 1)


async def test_a_client_hanging_up_right_after_done_is_accounted_as_served(
    gateway: tuple[str, list[UsageRecord], HoldingEngine],
) -> None:
    url, records, engine = gateway
    async with aiohttp.ClientSession() as s:
        resp = await s.post(url, json=BODY, headers={"Authorization": f"Bearer {KEY}"})
        await _read_to_done(resp)
        resp.close()  # as the openai client does: it stops at [DONE] and drops the connection
    await wait_for(lambda: records, DEADLINE_S, "the request accounted")
    engine.finish.set()
    assert (records[0].status, records[0].tokens_in, records[0].tokens_out) == (200, 12, 1)


async def test_a_stream_cut_short_is_charged_an_estimate_not_nothing(
    gateway: tuple[str, list[UsageRecord], HoldingEngine],
) -> None:
    # The client leaves after three events, before the usage event: the engine did the work, so the record
    # carries the prompt's estimate and a token per event forwarded (leaving early must not be free).
    url, records, engine = gateway
    engine.before, engine.after = [EVENTS[0]] * 3, EVENTS[1:]
    async with aiohttp.ClientSession() as s:
        resp = await s.post(url, json=BODY, headers={"Authorization": f"Bearer {KEY}"})
        seen = b""
        while seen.count(b"data:") < 3:
            chunk = await resp.content.readany()
            assert chunk, seen
            seen += chunk
        resp.close()
    await wait_for(lambda: records, DEADLINE_S, "the request accounted")
    engine.finish.set()
    rec = records[0]
    assert (rec.status, rec.tokens_out) == (499, 3)
    assert rec.tokens_in > 0 and rec.cost == (rec.tokens_in * 1.0 + 3 * 2.0) / 1e6
