"""M9: the router's HTTP/1.1 engine client is strict with what an engine answers.

Each test runs a raw-socket server on loopback that writes exact bytes, checks the error the client raises,
and checks that the connection the bad answer came on is closed by the client and never used again (the next
request arrives on a new connection, and the server sees the old one closed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from llmgw_router.upstream.http1 import EngineClient, UpstreamHttpError

GOOD = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{"ok":1}'


class RawEngine:
    """Answers the n-th connection's first request with `answers[n]` (then GOOD), byte for byte, and notes
    which connections the client closed."""

    def __init__(self, *answers: bytes, after: bytes = b"") -> None:
        self.answers = list(answers)
        self.after = after  # written on the first connection when send_after is set: unsolicited bytes
        self.send_after = asyncio.Event()
        self.connections = 0
        self.closed_by_client: set[int] = set()
        self.closed = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                answer = self.answers.pop(0) if self.answers else GOOD
                writer.write(answer)
                await writer.drain()
                if self.after and index == 0:
                    await self.send_after.wait()
                    writer.write(self.after)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client.add(index)
            self.closed.set()
        finally:
            writer.close()

    async def __aenter__(self) -> RawEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def wait_closed_by_client(self, index: int) -> None:
        async with asyncio.timeout(5):
            while index not in self.closed_by_client:
                self.closed.clear()
                await self.closed.wait()


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    c = EngineClient(connect_timeout=2.0, read_timeout=5.0)
    yield c
    c.close()


async def _refused(client: EngineClient, engine: RawEngine, error: type[BaseException], match: str) -> None:
    """The first answer raises `error`; its connection is closed and the next request uses a new one."""
    with pytest.raises(error, match=match):
        async with await client.post(engine.url, b"{}", {}) as resp:
            await resp.read()
    await engine.wait_closed_by_client(0)
    async with await client.post(engine.url, b"{}", {}) as resp:
        assert await resp.read() == b'{"ok":1}'
    assert engine.connections == 2


def _with_length(value: bytes, body: bytes = b"abc") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\n" + body


def _chunked(size: bytes, data: bytes = b"abc") -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\n" + data + b"\r\n0\r\n\r\n"


async def test_m9_negative_content_length_is_refused(client: EngineClient) -> None:
    async with RawEngine(_with_length(b"-3")) as engine:
        await _refused(client, engine, UpstreamHttpError, "bad Content-Length '-3'")


async def test_m9_content_length_with_underscore_is_refused(client: EngineClient) -> None:
    async with RawEngine(_with_length(b"1_0", b"0123456789")) as engine:
        await _refused(client, engine, UpstreamHttpError, "bad Content-Length '1_0'")


async def test_m9_content_length_with_plus_sign_is_refused(client: EngineClient) -> None:
    async with RawEngine(_with_length(b"+3")) as engine:
        await _refused(client, engine, UpstreamHttpError, r"bad Content-Length '\+3'")


async def test_m9_content_length_with_chunked_is_refused_and_the_connection_closed(
    client: EngineClient,
) -> None:
    both = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    async with RawEngine(both) as engine:
        await _refused(client, engine, UpstreamHttpError, "both Content-Length and Transfer-Encoding")


@pytest.mark.parametrize("size", [b"0x3", b"+3", b"_3", b"3_", b" 3"])
async def test_m9_chunk_size_that_is_not_plain_hex_is_refused(client: EngineClient, size: bytes) -> None:
    async with RawEngine(_chunked(size)) as engine:
        await _refused(client, engine, UpstreamHttpError, "bad chunk size")


async def test_m9_oversized_trailer_section_is_refused(client: EngineClient) -> None:
    trailer = b"X-Pad: " + b"a" * (9 * 1024) + b"\r\n"
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n" + trailer + b"\r\n"
    async with RawEngine(answer) as engine:
        await _refused(client, engine, UpstreamHttpError, "trailer section over 8192 bytes")


async def test_m9_oversized_head_is_refused(client: EngineClient) -> None:
    answer = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 0\r\n\r\n"
    async with RawEngine(answer) as engine:
        await _refused(client, engine, UpstreamHttpError, "response head is over")


async def test_m9_non_stream_body_over_the_cap_is_refused(client: EngineClient) -> None:
    # Announced as larger than the cap: refused before a byte of it is buffered.
    async with RawEngine(_with_length(b"%d" % (65 * 1024 * 1024))) as engine:
        await _refused(client, engine, UpstreamHttpError, "over the 67108864-byte limit")


async def test_m9_closed_delimited_body_over_the_cap_is_refused() -> None:
    small = EngineClient(connect_timeout=2.0, read_timeout=5.0)
    try:
        async with RawEngine(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 5000) as engine:
            with pytest.raises(UpstreamHttpError, match="over the 4096-byte limit"):
                async with await small.post(engine.url, b"{}", {}) as resp:
                    await resp.read(limit=4096)
            await engine.wait_closed_by_client(0)
            assert not small._idle.get(("127.0.0.1", int(engine.url.split(":")[2].split("/")[0])))
    finally:
        small.close()


async def test_m9_an_answer_dribbled_past_the_overall_deadline_times_out() -> None:
    # Each byte comes well inside the idle timeout; the whole answer does not come inside the deadline.
    strict = EngineClient(connect_timeout=2.0, read_timeout=5.0, request_deadline=0.5)

    async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        try:
            for _ in range(1000):
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            closed.set()
        finally:
            writer.close()

    closed = asyncio.Event()
    server = await asyncio.start_server(dribble, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TimeoutError):
            async with await strict.post(f"http://127.0.0.1:{port}/v1/x", b"{}", {}) as resp:
                await resp.read()
        async with asyncio.timeout(5):
            await closed.wait()  # the client closed the connection it gave up on
        assert not strict._idle.get(("127.0.0.1", port))
    finally:
        strict.close()
        server.close()


async def test_m9_pooled_connection_with_unsolicited_bytes_is_dropped(client: EngineClient) -> None:
    # After a complete answer, the engine writes a second, unasked-for answer on the idle connection. Reusing
    # that connection would hand it to the next request as its answer.
    stray = b'HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{"evil":1}'
    async with RawEngine(after=stray) as engine:
        async with await client.post(engine.url, b"{}", {}) as resp:
            assert await resp.read() == b'{"ok":1}'
        conn = client._idle[("127.0.0.1", int(engine.url.split(":")[2].split("/")[0]))][0]  # pooled
        engine.send_after.set()
        if not conn.buf:  # wait until the stray bytes reached the pooled connection
            await conn.wait_for_data(5.0, asyncio.get_running_loop().time() + 5.0)
        assert conn.buf.startswith(b"HTTP/1.1 200")
        async with await client.post(engine.url, b"{}", {}) as resp:
            assert await resp.read() == b'{"ok":1}'
        assert engine.connections == 2
        await engine.wait_closed_by_client(0)
