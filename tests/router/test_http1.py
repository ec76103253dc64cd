"""The router's lean HTTP/1.1 engine client against real sockets on loopback: bodies of every framing,
keep-alive reuse, stale pooled connections, engines that die, stall or answer garbage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from hypothesis import given, settings, strategies as st
from llmgw_router.upstream.http1 import EngineClient, EngineResponse, UpstreamHttpError, _Connection

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Engine:
    """A loopback server whose behaviour per connection is a coroutine; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> Engine:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return body


def answers(*responses: bytes, then_close: bool = False) -> Callable[[Engine], Handler]:
    """A handler that answers each request on a connection with the next canned response."""

    def make(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for response in responses:
                await engine.read_request(reader)
                writer.write(response)
                await writer.drain()
            if not then_close:
                await reader.read()  # keep the connection open until the client closes it

        return handle

    return make


async def engine_with(make: Callable[[Engine], Handler]) -> Engine:
    engine = Engine(lambda r, w: asyncio.sleep(0))
    engine.handler = make(engine)
    return engine


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    c = EngineClient(connect_timeout=2.0, read_timeout=2.0)
    yield c
    c.close()


async def test_content_length_answers_reuse_one_connection(client: EngineClient) -> None:
    body = b'{"ok": 1}'
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    async with await engine_with(answers(reply, reply, reply)) as engine:
        for _ in range(3):
            async with await client.post(engine.url, b'{"q": 1}', {"Authorization": "Bearer k"}) as resp:
                assert (resp.status, resp.header("content-type"), await resp.read()) == (
                    200,
                    "application/json",
                    body,
                )
        assert engine.connections == 1  # kept alive and reused
        first = engine.requests[0]
        assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert b"\r\nAuthorization: Bearer k\r\n" in first and first.endswith(b'\r\n\r\n{"q": 1}')


async def test_chunked_stream_arrives_as_sent_and_the_connection_is_reused(client: EngineClient) -> None:
    events = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]
    gate = asyncio.Event()

    def make(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for _ in range(2):
                await engine.read_request(reader)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                for i, event in enumerate(events):
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await writer.drain()
                    if i == 0:
                        await gate.wait()  # the client must see the first event before the rest exists
                writer.write(b"0\r\nX-Trailer: t\r\n\r\n")
                await writer.drain()
            await reader.read()

        return handle

    async with await engine_with(make) as engine:
        for _ in range(2):
            gate.clear()
            resp = await client.post(engine.url, b"{}", {})
            assert await resp.readany() == events[0]
            gate.set()
            rest = b""
            while data := await resp.readany():
                rest += data
            assert rest == events[1] + events[2]
            resp.release()
        assert engine.connections == 1


async def test_a_body_delimited_by_close_is_read_to_the_end_and_not_reused(client: EngineClient) -> None:
    reply = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"whole": true}'
    async with await engine_with(answers(reply, then_close=True)) as engine:
        async with await client.post(engine.url, b"{}", {}) as resp:
            assert await resp.read() == b'{"whole": true}'
        async with await client.post(engine.url, b"{}", {}) as resp:
            assert await resp.read() == b'{"whole": true}'
        assert engine.connections == 2


async def test_connection_close_is_honoured(client: EngineClient) -> None:
    reply = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    async with await engine_with(answers(reply)) as engine:
        for _ in range(2):
            async with await client.post(engine.url, b"{}", {}) as resp:
                assert await resp.read() == b"{}"
        assert engine.connections == 2


async def test_an_idle_connection_the_engine_closed_is_replaced_without_an_error(
    client: EngineClient,
) -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    closed = asyncio.Event()

    def make(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await engine.read_request(reader)
            writer.write(reply)
            await writer.drain()
            writer.close()  # an engine's keep-alive timeout, right after answering
            closed.set()

        return handle

    async with await engine_with(make) as engine:
        async with await client.post(engine.url, b"{}", {}) as resp:
            assert await resp.read() == b"{}"
        await asyncio.wait_for(closed.wait(), 5)
        async with await client.post(engine.url, b"{}", {}) as resp:  # the pooled one is dead by now
            assert await resp.read() == b"{}"
        assert engine.connections == 2 and len(engine.requests) == 2


async def test_a_pooled_connection_closed_as_it_is_reused_is_retried_once_on_a_new_one(
    client: EngineClient,
) -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    def make(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await engine.read_request(reader)
            writer.write(reply)
            await writer.drain()
            if engine.connections == 1:
                await reader.read(1)  # the next request starts arriving: close without an answer
            writer.close()

        return handle

    async with await engine_with(make) as engine:
        async with await client.post(engine.url, b"{}", {}) as resp:
            assert await resp.read() == b"{}"
        async with await client.post(engine.url, b"{}", {}) as resp:
            assert await resp.read() == b"{}"
        assert engine.connections == 2


async def test_a_connection_idle_past_the_idle_timeout_is_closed_not_reused() -> None:
    # A node that vanished without closing its sockets leaves pooled connections that look alive.
    now = [1000.0]
    aging = EngineClient(connect_timeout=2.0, read_timeout=2.0, idle_timeout=15.0, clock=lambda: now[0])
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    async with await engine_with(answers(reply, reply, reply)) as engine:
        for step in (0.0, 14.0, 16.0):  # reused after 14 s idle, not after 16 s
            now[0] += step
            async with await aging.post(engine.url, b"{}", {}) as resp:
                assert await resp.read() == b"{}"
        assert engine.connections == 2
    aging.close()


async def test_an_engine_dying_mid_body_is_an_upstream_error(client: EngineClient) -> None:
    reply = b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial'
    async with await engine_with(answers(reply, then_close=True)) as engine:
        resp = await client.post(engine.url, b"{}", {})
        with pytest.raises(UpstreamHttpError, match="closed"):
            await resp.read()
        resp.close()


async def test_an_engine_that_never_answers_times_out() -> None:
    stalled = EngineClient(connect_timeout=2.0, read_timeout=0.2)

    def make(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await engine.read_request(reader)
            await reader.read()  # never answers

        return handle

    async with await engine_with(make) as engine:
        with pytest.raises(TimeoutError):
            await stalled.post(engine.url, b"{}", {})
    stalled.close()


async def test_refused_connections_and_garbage_answers_are_upstream_errors(client: EngineClient) -> None:
    async with await engine_with(answers(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")) as engine:
        with pytest.raises(UpstreamHttpError, match=r"not an HTTP/1\.1 answer"):
            await client.post(engine.url, b"{}", {})
        url = engine.url
    with pytest.raises(UpstreamHttpError, match=r"connect to 127\.0\.0\.1"):
        await client.post(url, b"{}", {})


async def test_interim_answers_are_skipped(client: EngineClient) -> None:
    reply = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
    async with await engine_with(answers(reply)) as engine:
        resp = await client.post(engine.url, b"{}", {})
        assert (resp.status, await resp.read()) == (201, b"{}")
        resp.release()


async def test_header_values_cannot_smuggle_a_second_header(client: EngineClient) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        await client.post(
            "http://127.0.0.1:9/v1/x", b"{}", {"x-request-id": "a\r\nAuthorization: Bearer stolen"}
        )
    with pytest.raises(ValueError, match="plain http"):
        await client.post("https://api.example.com/v1/x", b"{}", {})


def test_the_client_works_on_uvloop_too() -> None:
    uvloop = pytest.importorskip("uvloop")  # the router runs on it when installed

    async def scenario() -> None:
        c = EngineClient(connect_timeout=2.0, read_timeout=2.0)
        reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        async with await engine_with(answers(reply, reply)) as engine:
            for _ in range(2):
                async with await c.post(engine.url, b"{}", {}) as resp:
                    assert await resp.read() == b"{}"
            assert engine.connections == 1
        c.close()

    uvloop.run(scenario())


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for size in sizes:
        piece = body[i : i + size]
        if not piece:
            break
        out += b"%x;ext=1\r\n%s\r\n" % (len(piece), piece)
        i += len(piece)
    if i < len(body):
        out += b"%x\r\n%s\r\n" % (len(body) - i, body[i:])
    return out + b"0\r\n\r\n"


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(min_size=0, max_size=300),
    sizes=st.lists(st.integers(1, 40), max_size=12),
    cuts=st.lists(st.integers(1, 17), min_size=1, max_size=40),
)
def test_chunked_decoding_does_not_depend_on_how_bytes_arrive(
    body: bytes, sizes: list[int], cuts: list[int]
) -> None:
    wire = _chunked(body, sizes) + b"HTTP/1.1 next"  # the next response's first bytes must stay unread
    conn = _Connection(("h", 1))
    resp = EngineResponse(EngineClient(1.0, 1.0), conn, 200, {"transfer-encoding": "chunked"})
    got, pos, i = b"", 0, 0
    while pos < len(wire):
        step = cuts[i % len(cuts)]
        conn.buf += wire[pos : pos + step]
        pos += step
        i += 1
        got += resp._take(conn)
    assert got == body and resp._done
    assert bytes(conn.buf) == b"HTTP/1.1 next"
