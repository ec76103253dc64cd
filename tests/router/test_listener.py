"""The API listener's own rules (listener.py), on loopback: keep-alive, pipelining in order, the head timeout,
parsing limits, the body limit before the body is read, HTTP/1.0, Expect, a client that leaves cancels its
handler, a stalled client is cut off, and a pre-bound (SO_REUSEPORT) socket.

Raw sockets for what no client library sends; aiohttp's client for the rest. The handlers are the test's own
so each rule is seen alone; the router's whole path on this listener is tests/router/test_integration.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Mapping

import aiohttp
import pytest
from llmgw_router.app import serve
from llmgw_router.path.service import RequestService
from llmgw_router.server import listener as listener_mod
from llmgw_router.server.exchange import ClientStalled, Exchange, json_reply
from llmgw_router.server.listener import MAX_HEAD, MAX_TARGET, ApiListener, Handler
from support import wait_for

from llmgw.core.snapshot import RouterSnapshot

LIMIT = 1000


class Recorder:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.stalled: list[str] = []
        self.release = asyncio.Event()

    def routes(self) -> Mapping[str, Mapping[str, Handler]]:
        async def echo(ex: Exchange) -> None:
            body = await ex.read_body(LIMIT)
            self.started.append(ex.path)
            ex.respond(json_reply({"path": ex.path, "len": len(body), "ua": ex.headers.get("USER-AGENT")}))

        async def slow(ex: Exchange) -> None:
            self.started.append(ex.path)
            await asyncio.sleep(0.2)  # answered after the quick request behind it would have been
            ex.respond(json_reply({"path": ex.path}))

        async def hold(ex: Exchange) -> None:
            self.started.append(ex.path)
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(ex.path)
                raise
            ex.respond(json_reply({"path": ex.path}))

        async def flood(ex: Exchange) -> None:
            ex.start_stream(200, {"Content-Type": "text/event-stream"})
            try:
                while True:
                    await ex.write(b"data: " + b"x" * 65536 + b"\n\n", 0.3)
            except ClientStalled:
                self.stalled.append(ex.path)

        return {
            "/echo": {"POST": echo, "GET": echo},
            "/slow": {"GET": slow},
            "/hold": {"GET": hold},
            "/flood": {"GET": flood},
        }


@pytest.fixture
async def served() -> AsyncIterator[tuple[Recorder, ApiListener, int]]:
    rec = Recorder()
    listener = ApiListener(rec.routes(), lambda: LIMIT, head_timeout=0.5, idle_timeout=30.0, linger=1.0)
    port = await listener.start("127.0.0.1", 0)
    try:
        yield rec, listener, port
    finally:
        await listener.close(grace=0.5)


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length (what the listener sends for a whole answer)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 5)
    return status, headers, body


async def closed_by_server(reader: asyncio.StreamReader, limit_s: float = 5.0) -> bool:
    """Reads until the server closes (True), or the deadline passes (False)."""
    try:
        async with asyncio.timeout(limit_s):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


GET = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_keep_alive_serves_several_requests_on_one_connection(served: tuple) -> None:
    _, listener, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\nContent-Length: 2\r\n\r\n{}")
        status, headers, body = await read_reply(reader)
        assert status == 200 and "connection" not in headers
        assert json.loads(body) == {"path": "/echo", "len": 2, "ua": "t"}  # headers in any case
    assert len(listener.connections) == 1
    writer.close()


async def test_header_names_are_read_in_any_case_past_the_kept_names_bound(served: tuple) -> None:
    """Names a client makes up are not all kept (listener._NAMES is bounded), and are read alike past it."""
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(listener_mod._NAMES_KEPT // 50 + 2):
        made_up = b"".join(b"X-Made-Up-%d-%d: v\r\n" % (i, j) for j in range(50))
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + made_up + b"USER-agent: t%d\r\n" % i)
        writer.write(b"Content-Length: 2\r\n\r\n{}")
        status, _, body = await read_reply(reader)
        assert status == 200 and json.loads(body)["ua"] == f"t{i}"
    assert len(listener_mod._NAMES) <= listener_mod._NAMES_KEPT
    writer.close()


async def test_a_header_name_longer_than_any_real_one_is_read_and_never_kept(
    served: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, port = served
    monkeypatch.setattr(listener_mod, "_NAMES", {})  # room in the table: only the length keeps it out
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    long_name = b"X-" + b"n" * 4000
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + long_name + b": v\r\nUser-Agent: long\r\n")
    writer.write(b"Content-Length: 2\r\n\r\n{}")
    status, _, body = await read_reply(reader)
    assert status == 200 and json.loads(body)["ua"] == "long"
    assert long_name not in listener_mod._NAMES and b"User-Agent" in listener_mod._NAMES
    writer.close()


async def test_pipelined_requests_are_answered_in_order(served: tuple) -> None:
    rec, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET % b"/slow" + GET % b"/echo" + GET % b"/echo?q=1")
    paths = [json.loads((await read_reply(reader))[2])["path"] for _ in range(3)]
    assert paths == ["/slow", "/echo", "/echo"]
    assert rec.started == ["/slow", "/echo", "/echo"]  # one at a time: the second began after the first
    writer.close()


async def test_a_head_that_does_not_finish_in_time_is_closed(served: tuple) -> None:
    _, listener, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never the rest
    assert await closed_by_server(reader, 5.0)
    await wait_for(lambda: not listener.connections, 5, "the slow connection to be gone")
    writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"a" * (MAX_TARGET + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /echo HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n", 431),
        (b"GET /echo HTTP/1.1\r\nX-Big: " + b"v" * MAX_HEAD + b"\r\n\r\n", 431),
        (b"GET /echo HTTP/1.1\r\nX-Bad: a\x01b\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 400),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", 400),  # a TLS hello on the plain port
    ],
    ids=[
        "target",
        "header-count",
        "head-size",
        "control-char",
        "cl-and-te",
        "signed-length",
        "repeated-length",
        "coded-body",
        "tls",
    ],
)
async def test_a_malformed_request_is_one_openai_error_and_one_warning_line(
    served: tuple, request_bytes: bytes, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    with caplog.at_level(logging.WARNING, logger="llmgw_router.server.listener"):
        writer.write(request_bytes)
        got, headers, body = await read_reply(reader)
        assert await closed_by_server(reader)
    assert got == status and headers["connection"] == "close"
    assert json.loads(body)["error"]["message"]
    records = [r for r in caplog.records if r.name == "llmgw_router.server.listener"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING and records[0].exc_info is None
    writer.close()


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(served: tuple) -> None:
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (LIMIT + 1))
    status, headers, body = await read_reply(reader)  # no byte of the body was sent
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "request_too_large"
    writer.close()


async def test_a_chunked_body_over_the_limit_is_413_and_the_rest_is_read_away(served: tuple) -> None:
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    chunk = b"x" * 600
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20)) + b"0\r\n\r\n")
    status, _, body = await read_reply(reader)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert await closed_by_server(reader)
    writer.close()


async def test_http_1_0_is_answered_and_closed(served: tuple) -> None:
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /echo HTTP/1.0\r\n\r\n")
    status, headers, _ = await read_reply(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()


async def test_connection_close_is_honoured(served: tuple) -> None:
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, headers, _ = await read_reply(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()


async def test_expect_100_continue_is_answered_before_the_body(served: tuple) -> None:
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim.startswith(b"HTTP/1.1 100 ")
    writer.write(b"{}")
    status, _, body = await read_reply(reader)
    assert status == 200 and json.loads(body)["len"] == 2
    writer.close()


async def test_unknown_path_is_404_and_wrong_method_405_in_openai_shape(served: tuple) -> None:
    _, _, port = served
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/v2/nothing") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
        async with s.post(f"http://127.0.0.1:{port}/slow", data=b"{}") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET, HEAD"
            assert (await r.json())["error"]["code"] == "method_not_allowed"


async def test_head_on_a_get_path_is_its_head_without_the_body(served: tuple) -> None:
    _, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n" + GET % b"/echo")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: " in head
    status, _, body = await read_reply(reader)  # the next answer follows at once: no body was sent
    assert status == 200 and json.loads(body)["path"] == "/echo"
    writer.close()


async def test_a_client_that_goes_away_cancels_its_handler(served: tuple) -> None:
    rec, _, port = served
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET % b"/hold")
    await wait_for(lambda: rec.started == ["/hold"], 5, "the handler to start")
    writer.close()
    await wait_for(lambda: rec.cancelled == ["/hold"], 5, "the handler to be cancelled")


async def test_a_client_that_reads_nothing_is_cut_off_after_the_write_timeout(served: tuple) -> None:
    rec, listener, port = served
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(GET % b"/flood")  # and never read
    try:
        await wait_for(lambda: rec.stalled == ["/flood"], 10, "the stalled stream to be cut off")
        await wait_for(lambda: not listener.connections, 5, "its connection to be gone")
    finally:
        sock.close()


async def test_serve_accepts_a_pre_bound_reuseport_socket() -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    listeners = await serve(RequestService(), "127.0.0.1:1", "127.0.0.1:0", scrape=False, api_socket=sock)
    try:
        assert listeners.api_port == port
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/health") as r:
                assert r.status == 200 and await r.json() == {"status": "ok"}
            async with s.get(f"http://127.0.0.1:{port}/ready") as r:
                assert r.status == 503  # no snapshot yet
    finally:
        await listeners.close()


async def test_through_the_router_a_client_that_leaves_closes_the_engine_call_and_frees_its_slot() -> None:
    """The whole path on this listener: the engine holds its answer; the client hangs up; the router's
    handler is cancelled, so the engine's connection is closed and the endpoint's claim released."""
    engine_saw: list[str] = []

    async def silent_engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        engine_saw.append("request")
        await reader.read()  # answers nothing; returns when the router closes the connection
        engine_saw.append("closed")
        writer.close()

    engine = await asyncio.start_server(silent_engine, "127.0.0.1", 0)
    engine_port = engine.sockets[0].getsockname()[1]
    router = RequestService()
    router.apply_snapshot(
        RouterSnapshot.model_validate(
            {
                "revision": "r1",
                "models": {"m": {"context_length": 2048, "capabilities": ["chat"]}},
                "endpoints": [
                    {
                        "replica_id": "e1",
                        "model": "m",
                        "engine": "vllm",
                        "base_url": f"http://127.0.0.1:{engine_port}",
                        "api_key": "engine-key",
                    }
                ],
            }
        )
    )
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    try:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
        _, writer = await asyncio.open_connection("127.0.0.1", listeners.api_port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await wait_for(lambda: engine_saw == ["request"], 10, "the engine to get the request")
        assert router.table is not None
        (ep,) = router.table.all_endpoints()
        assert ep.inflight == 1
        writer.close()
        await wait_for(lambda: engine_saw == ["request", "closed"], 10, "the engine call to be closed")
        await wait_for(lambda: ep.inflight == 0, 5, "the endpoint's claim to be released")
    finally:
        await listeners.close()
        engine.close()
