"""H6: an anonymous client cannot hold the router's API listener. A body that never comes is answered 408 when
its deadline passes, a head that never ends too; connections no request with a valid key has come on are
capped per client address and in all, the oldest closed to admit a new one; a connection that authenticated
once is never cut for that; behind a trusted proxy the client it names is what is capped, not the proxy.

A router in the test's loop (request_path.py) on loopback, fed by raw sockets that send what the review's
exploit sends: `POST /v1/chat/completions` with `Content-Length` and no body, and no key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from llmgw_router.app import Listeners
from llmgw_router.server.exchange import Exchange, Headers
from llmgw_router.server.listener import ApiListener
from llmgw_router.server.peers import ConnectionRules, forwarded_client
from support import wait_for

from .request_path import KEY, catalog, model, published, start_router

pytestmark = pytest.mark.integration

STALLED = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 10\r\n\r\n"
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer %s\r\n\r\n" % KEY.encode()


@pytest.fixture
async def router_with(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Listeners, int]]:
    listener: dict[str, Any] = request.param
    snap = published(catalog(model("m")), [], listener=listener)
    _router, listeners, _loads, _url = await start_router(snap)
    try:
        yield listeners, listeners.api_port
    finally:
        await listeners.close()


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))


async def closed_by_router(reader: asyncio.StreamReader) -> bool:
    """Whether the router closed this connection (EOF or reset) rather than keeping it open."""
    try:
        async with asyncio.timeout(0.2):
            return await reader.read(1) == b""
    except TimeoutError:
        return False  # still open: nothing came, nothing ended
    except ConnectionError:
        return True


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]  # the writer kept: one collected closes its socket


async def open_idle(port: int, listeners: Listeners, count: int, source: str = "127.0.0.1") -> list[Conn]:
    """`count` connections that send nothing, each accepted by the router before the next is opened (so
    the order the router counts them in is the order they were opened)."""
    api = listeners.api

    def seen() -> tuple[int, int]:  # grows at each accept: one more connection, or one older closed for it
        return len(api.connections), api.evicted

    async def one() -> Conn:
        before = seen()
        opened = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        await wait_for(lambda: seen() > before, 5, "the accept")
        return opened

    return [await one() for _ in range(count)]


@pytest.mark.parametrize("router_with", [{"body_timeout": "1s"}], indirect=True)
async def test_h6_a_body_that_never_comes_is_answered_408(router_with: tuple[Listeners, int]) -> None:
    listeners, port = router_with
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(STALLED)  # the review's exploit: a head, then no body, ever
    async with asyncio.timeout(10):  # the body deadline is 1 s; the sweep looks at least once a second
        status, _headers, body = await read_reply(reader)
        assert await reader.read() == b"", "the connection is closed after the 408"
    assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
    await wait_for(lambda: not listeners.api.connections, 5, "the stalled connection to be gone")


async def test_h6_a_head_that_never_ends_is_answered_408() -> None:
    async def never(ex: Exchange) -> None:
        raise AssertionError("no handler runs for a head that never ended")

    listener = ApiListener({"/": {"GET": never}}, lambda: 1024, head_timeout=0.5)
    port = await listener.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: r\r\n")  # and never the blank line
        async with asyncio.timeout(10):
            status, _headers, _body = await read_reply(reader)
            assert await reader.read() == b""
        assert status == 408
    finally:
        await listener.close()


@pytest.mark.parametrize("router_with", [{"max_unauthenticated_per_peer": 8}], indirect=True)
async def test_h6_anonymous_connections_are_capped_oldest_first_and_a_key_is_never_cut(
    router_with: tuple[Listeners, int],
) -> None:
    listeners, port = router_with
    keyed_reader, keyed = await asyncio.open_connection("127.0.0.1", port)
    keyed.write(MODELS)
    assert (await read_reply(keyed_reader))[0] == 200  # authenticated: kept alive, no longer counted

    idle = await open_idle(port, listeners, 20)
    closed = [await closed_by_router(r) for r, _w in idle]
    assert closed == [True] * 12 + [False] * 8, "the oldest twelve went, the newest eight stay"
    assert listeners.api.evicted == 12

    keyed.write(MODELS)  # the authenticated keep-alive connection outlived all of it
    assert (await read_reply(keyed_reader))[0] == 200
    fresh_reader, fresh = await asyncio.open_connection("127.0.0.1", port)
    fresh.write(MODELS)  # and a new client with a key is admitted at the cap (the oldest idle one goes)
    assert (await read_reply(fresh_reader))[0] == 200


@pytest.mark.parametrize(
    "router_with", [{"max_unauthenticated_per_peer": 4, "max_unauthenticated": 6}], indirect=True
)
async def test_h6_one_address_floods_only_its_own_share_until_the_overall_cap(
    router_with: tuple[Listeners, int],
) -> None:
    listeners, port = router_with
    other = await open_idle(port, listeners, 2, source="127.0.0.2")
    flood = await open_idle(port, listeners, 10, source="127.0.0.1")
    assert [await closed_by_router(r) for r, _w in flood] == [True] * 6 + [False] * 4
    assert not any([await closed_by_router(r) for r, _w in other]), "another address keeps its connections"
    await open_idle(port, listeners, 1, source="127.0.0.3")  # 7 past the overall 6: the oldest of all goes
    assert [await closed_by_router(r) for r, _w in other] == [True, False]


@pytest.mark.parametrize(
    "router_with",
    [{"max_unauthenticated_per_peer": 4, "trusted_proxies": ["127.0.0.0/8"], "body_timeout": "60s"}],
    indirect=True,
)
async def test_h6_behind_a_trusted_proxy_the_client_it_names_is_capped(
    router_with: tuple[Listeners, int],
) -> None:
    listeners, port = router_with
    pool = await open_idle(port, listeners, 10)  # a load balancer's idle pool: never cut for its address
    named = await open_idle(port, listeners, 6)
    forwarded = b"Host: r\r\nX-Forwarded-For: 1.2.3.4, 203.0.113.7\r\n"
    for _reader, writer in named:  # each forwards a request for the same client, whose body never comes
        writer.write(STALLED.replace(b"Host: r\r\n", forwarded))
    await wait_for(lambda: listeners.api.evicted == 2, 5, "the named client's oldest two to be closed")
    assert [await closed_by_router(r) for r, _w in named] == [True] * 2 + [False] * 4
    assert not any([await closed_by_router(r) for r, _w in pool]), "the proxy's own connections stay"


def test_h6_a_forwarded_chain_is_believed_only_from_trusted_hops() -> None:
    rules = ConnectionRules(trusted_proxies=(ipaddress.ip_network("10.0.0.0/8"),))

    def client(**fields: str) -> str | None:
        return forwarded_client(Headers({k.replace("_", "-"): v for k, v in fields.items()}), rules)

    # The client wrote the left part itself: only what the trusted hops appended counts.
    assert client(x_forwarded_for="9.9.9.9, 203.0.113.7, 10.0.0.2") == "203.0.113.7"
    assert client(x_forwarded_for="203.0.113.7:5000") == "203.0.113.7"
    assert client(forwarded='for=9.9.9.9, for="[2001:db8::1]:4711";proto=https') == "2001:db8::1"
    assert client(x_forwarded_for="10.0.0.3, 10.0.0.2") == "10.0.0.3", "every hop trusted: the first"
    assert client(x_forwarded_for="203.0.113.7, nonsense") is None, "garbage nearest: nothing believed"
    assert client() is None
