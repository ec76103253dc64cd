"""H4: a client that stops reading a stream neither pins its endpoint slot nor makes the router buffer the
whole answer.

A real router process in front of a stand-in engine (in the test's loop) that streams SSE as fast as the
router takes it, in the sim engine's format and with its metric names. Clients are raw sockets with a 4 KiB
receive buffer that send one streaming request and then read nothing.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from faults.procs import RouterProc, rss_kb, start_router_proc
from support import wait_for

from llmgw.core.snapshot import RouterSnapshot

pytestmark = pytest.mark.integration

STREAM_BYTES = 6 * 1024 * 1024  # each answer: at least 5 MB of events
# What the router may hold per stalled stream: the engine connection's buffer pauses reading above 256 KiB
# (plus one socket read), the chunk being written, and aiohttp's write buffer (64 KiB high-water mark).
PER_STREAM_CAP = 1024 * 1024
CLIENTS = 50


@dataclass
class StreamState:
    written: int = 0
    blocked_since: float | None = None  # the loop's clock: when the current write started waiting
    done: bool = False
    closed_by_router: bool = False


class FastEngine:
    """Streams `stream_bytes` of chat-completion chunks per request, 64 KiB per write, then [DONE]."""

    def __init__(self, stream_bytes: int) -> None:
        self.stream_bytes = stream_bytes
        self.streams: list[StreamState] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        event = {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "word " * 20}, "finish_reason": None}],
        }
        one = f"data: {json.dumps(event)}\n\n".encode()
        self.block = one * (64 * 1024 // len(one))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        state = StreamState()
        self.streams.append(state)
        loop = asyncio.get_running_loop()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while state.written < self.stream_bytes:
                state.blocked_since = loop.time()
                await resp.write(self.block)
                state.blocked_since = None
                state.written += len(self.block)
            await resp.write(b"data: [DONE]\n\n")
            state.done = True
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            state.closed_by_router = True
            state.blocked_since = None
        return resp

    async def _metrics(self, request: web.Request) -> web.Response:
        running = sum(1 for s in self.streams if not s.done and not s.closed_by_router)
        text = (
            f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            'vllm:num_requests_waiting{model_name="m"} 0\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def __aenter__(self) -> FastEngine:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def _router(tmp: Path, engine: FastEngine, write_timeout: float) -> RouterProc:
    snap = {
        "revision": "slow-reader",
        "models": {"m": {"context_length": 1_000_000}},
        "endpoints": [
            {
                "replica_id": "r1",
                "model": "m",
                "engine": "sim",
                "base_url": f"http://127.0.0.1:{engine.port}",
                "slots": 2 * CLIENTS,
            }
        ],
    }
    RouterSnapshot.model_validate(snap)
    path = tmp / "snapshot.json"
    path.write_text(json.dumps(snap))
    args = ["--snapshot", str(path), "--no-auth", "--write-timeout", str(write_timeout)]
    return start_router_proc(tmp / "router.log", args)


def _stalled_client(router: RouterProc) -> socket.socket:
    """A client with a 4 KiB receive buffer that sends a streaming request and never reads."""
    host, port = router.api.removeprefix("http://").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, int(port)))
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 900_000}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    s.sendall(head + body)
    return s


async def _inflight(router: RouterProc) -> float:
    async with aiohttp.ClientSession() as s, s.get(router.metrics + "/metrics") as resp:
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmgw_router_endpoint_inflight{")
    )


async def test_h4_a_client_that_stops_reading_frees_its_slot_after_the_write_timeout(tmp_path: Path) -> None:
    # A stream far longer than every buffer on the way (kernel ones included), so it cannot just finish.
    async with FastEngine(256 * 1024 * 1024) as engine:
        await _one_stalled_client(tmp_path, engine)


async def _one_stalled_client(tmp_path: Path, engine: FastEngine) -> None:
    router = _router(tmp_path, engine, write_timeout=1.0)
    client = _stalled_client(router)
    try:
        await wait_for(lambda: engine.streams, 30, "the stream to reach the engine")
        await wait_for(lambda: _inflight_is(router, 1.0), 30, "the router to count the stream in flight")
        # The router cuts the client off: the slot is free again and the engine's stream is closed.
        await wait_for(lambda: _inflight_is(router, 0.0), 30, "the stalled stream's slot to be freed")
        await wait_for(lambda: engine.streams[0].closed_by_router, 30, "the engine stream to be closed")
        assert not engine.streams[0].done  # cut off mid-stream, not finished
    finally:
        client.close()
        router.stop()


async def _inflight_is(router: RouterProc, value: float) -> bool:
    return await _inflight(router) == value


async def test_h4_fifty_stalled_streams_keep_router_memory_bounded(tmp_path: Path) -> None:
    async with FastEngine(STREAM_BYTES) as engine:
        await _fifty_stalled_clients(tmp_path, engine)


async def _fifty_stalled_clients(tmp_path: Path, engine: FastEngine) -> None:
    router = _router(tmp_path, engine, write_timeout=600.0)  # nobody is cut off while memory is measured
    clients: list[socket.socket] = []
    try:
        # Warm up: one stream read to the end, so the baseline includes what serving a stream costs once.
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                router.api + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True},
            ) as resp,
        ):
            assert resp.status == 200
            async for _ in resp.content.iter_any():
                pass
        baseline = rss_kb(router.pid)
        clients = [_stalled_client(router) for _ in range(CLIENTS)]
        await wait_for(lambda: len(engine.streams) == CLIENTS + 1, 60, "every stalled stream to start")
        loop = asyncio.get_running_loop()

        def settled() -> bool:
            # Every stream's engine is either done (kernel buffers on the way can hold a 6 MB stream) or has
            # waited on one write for 2 s: the router takes no more, so its memory is at its most.
            now = loop.time()
            return all(
                st.done or (st.blocked_since is not None and now - st.blocked_since > 2.0)
                for st in engine.streams[1:]
            )

        await wait_for(settled, 120, "every stalled stream to stop moving")
        written = sum(st.written for st in engine.streams)
        grown_kb = rss_kb(router.pid) - baseline
        assert settled() and sum(st.written for st in engine.streams) == written  # still still
        bound_kb = (CLIENTS * PER_STREAM_CAP + 20 * 1000 * 1000) // 1024
        assert grown_kb < bound_kb, f"router RSS grew by {grown_kb} KiB (bound {bound_kb} KiB)"
    finally:
        for c in clients:
            c.close()
        router.stop()
