"""H8: engines' KV-event publishers are reached by routers only, through the pass-through's key check, and
frames from engines are capped on both sides of the relay.

The review's exploit: a ZMQ SUB connected to the engine's publisher port on the node's serving address received
every tenant's token ids, with no credential; and a publisher (a compromised node, or a local user who binds the
port first) could send a multi-GB frame into every router. Here a real agent process starts a real sim engine
on the serving address 127.0.0.2 (loopback, but another address than the engines' 127.0.0.1, so the socket
table tells them apart), and real pyzmq publishers stand in for hostile ones.
"""

from __future__ import annotations

import asyncio
import socket
import tracemalloc
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
from agent.fake_controller import FakeController
from agent.test_daemon import AgentProcs, registered, sim_spec, start_ready
from aiohttp import web
from llmgw_agent.kv_relay import RELAY_PATH
from llmgw_agent.passthrough import PassThrough, key_digest
from llmgw_router.decisions.prefix import EventIndex
from llmgw_router.fleet.kv_events import EventStreamError, read_record, subscribe
from support import free_port, wait_for

from .test_engine_listen import children, listening_sockets

SERVING = "127.0.0.2"
KEY = "engine-key"
MIB = 1024 * 1024


@pytest.mark.integration
async def test_h8_the_publisher_is_not_on_the_serving_address_and_only_key_holders_read_its_relay(
    ctl: FakeController, agents: AgentProcs
) -> None:
    agents.start([ctl.url], advertise_host=SERVING, bind_host=SERVING)
    await registered(ctl)
    status = await start_ready(ctl, agents, sim_spec("rep-h8", kv_events={"hash_seed": "0"}))
    assert status.pid is not None and status.kv_events_port is not None

    # The outsider's probe: nothing listens on the serving address but the pass-through.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((SERVING, status.kv_events_port), timeout=5).close()
    assert listening_sockets(status.pid) == {(SERVING, status.port)}
    (engine,) = children(status.pid)
    assert (("127.0.0.1", status.kv_events_port)) in listening_sockets(engine)
    assert {address for address, _ in listening_sockets(engine)} == {"127.0.0.1"}

    assert status.base_url is not None and status.kv_events_path == RELAY_PATH
    relay = status.base_url + RELAY_PATH
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            async with http.get(relay, headers=headers) as resp:
                assert resp.status == 401, headers
                assert (await resp.json())["error"]["code"] == "invalid_api_key"
        # The key holder (a router) gets the events: the token ids of a chat request sent with the key.
        async with http.get(relay, headers={"Authorization": f"Bearer {KEY}"}) as stream:
            assert stream.status == 200
            records = Records(stream.content)

            async def stored() -> list[Any] | None:
                # the subscription joins the publisher asynchronously: ask until a batch comes back
                chat = {"model": "sim-model", "messages": [{"role": "user", "content": "w " * 40}]}
                async with http.post(
                    status.base_url + "/v1/chat/completions",
                    json={**chat, "max_tokens": 1},
                    headers={"Authorization": f"Bearer {KEY}"},
                ) as r:
                    assert r.status == 200
                parts = await records.next(1.0)
                if parts is None:
                    return None
                return [e for e in msgpack.unpackb(parts[-1])[1] if e[0] == "BlockStored"]

            try:
                events = await wait_for(stored, 30, "a BlockStored batch through the relay")
            finally:
                await records.close()
    assert events[0][3], "BlockStored carries the prompt's token ids: what only key holders may read"


class Records:
    """Reads a relay stream's records (heartbeats skipped) in a task of its own, so waiting for one with a
    deadline never cuts a record in half; `ended` holds why the stream ended, once it has."""

    def __init__(self, content: aiohttp.StreamReader) -> None:
        self.queue: asyncio.Queue[list[bytes]] = asyncio.Queue()
        self.ended: BaseException | None = None
        self._task = asyncio.create_task(self._read(content))

    async def _read(self, content: aiohttp.StreamReader) -> None:
        try:
            while True:
                parts = await read_record(content)
                if parts is not None:
                    self.queue.put_nowait(parts)
        except (EventStreamError, aiohttp.ClientError) as exc:
            self.ended = exc

    async def next(self, limit_s: float) -> list[bytes] | None:
        try:
            return await asyncio.wait_for(self.queue.get(), limit_s)
        except TimeoutError:
            return None

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def test_h8_the_router_never_subscribes_to_a_publishers_own_address() -> None:
    """A snapshot naming a tcp:// publisher (as controllers before the relay published) is not read: the
    subscription ends at once, having connected nowhere."""
    index = EventIndex(capacity=10, stale_after=5)
    async with aiohttp.ClientSession() as session:
        task = subscribe(session, "ep", "tcp://127.0.0.1:5557", KEY, index, lambda: 1.0)
        await asyncio.wait_for(task, 10)
    assert not index.heard("ep") and index.bad_batches("ep") == 0


async def _serve(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get(RELAY_PATH, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}{RELAY_PATH}"


async def test_h8_the_router_refuses_an_oversized_record_from_its_length_without_reading_it() -> None:
    """A hostile relay (a compromised node) claims a 1 GiB record and streams bytes after it: the router drops
    the stream at the length, counts a bad batch, and reads the next connection's good batch; its memory does
    not grow with what was offered."""
    offered: list[int] = []
    connections: list[str] = []
    finished = asyncio.Event()
    chunk = bytes(MIB)
    good = msgpack.packb([0.0, [["BlockStored", [7, 8], None, list(range(32)), 16]]])

    async def hostile(request: web.Request) -> web.StreamResponse:
        assert request.headers.get("Authorization") == f"Bearer {KEY}"
        connections.append("hostile" if not connections else "good")
        resp = web.StreamResponse()
        await resp.prepare(request)
        if connections[-1] == "good":
            body = b"".join(
                len(p).to_bytes(4, "big") + p for p in (b"kv-events", (1).to_bytes(8, "big"), good)
            )
            await resp.write(len(body).to_bytes(4, "big") + body)
            await finished.wait()  # held open, as a relay between events
            return resp
        sent = 0
        try:
            await resp.write((1024 * MIB).to_bytes(4, "big"))
            while sent < 256 * MIB:
                await resp.write(chunk)
                sent += len(chunk)
        except ConnectionError:
            pass
        offered.append(sent)
        return resp

    runner, url = await _serve(hostile)
    index = EventIndex(capacity=1000, stale_after=5)
    tracemalloc.start()
    try:
        baseline, _ = tracemalloc.get_traced_memory()
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(subscribe(session, "ep", url, KEY, index, lambda: 1.0))
            try:
                await wait_for(lambda: index.heard("ep"), 30, "the good batch after the dropped stream")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        finished.set()
        await runner.cleanup()
    assert index.bad_batches("ep") == 1 and index.size("ep") == 2
    assert offered and offered[0] < 256 * MIB, "the router stopped reading at the length"
    assert peak - baseline < 8 * MIB, f"the router's memory grew by {peak - baseline} bytes"


async def test_h8_the_relay_drops_a_publisher_frame_over_its_cap_and_passes_the_next() -> None:
    """A local publisher (a user who bound the port before the engine) sends a 64 MiB frame: the relay ends
    that subscriber's stream without reading it whole, and the next subscription carries normal batches."""
    events_port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{events_port}")
    huge = bytes(64 * MIB)
    front = PassThrough("127.0.0.1", free_port(), free_port(), key_digest(KEY), kv_events_port=events_port)
    await front.start()
    url = f"http://127.0.0.1:{front.listen_port}{RELAY_PATH}"
    auth = {"Authorization": f"Bearer {KEY}"}
    tracemalloc.start()
    try:
        baseline, _ = tracemalloc.get_traced_memory()
        async with aiohttp.ClientSession() as http:
            async with http.get(url, headers=auth) as stream:
                assert stream.status == 200
                records = Records(stream.content)

                async def ended() -> bool:
                    # sent again until the subscription has joined the publisher and the relay has seen one
                    pub.send_multipart([b"kv-events", (1).to_bytes(8, "big"), huge])
                    assert await records.next(0.5) is None, "nothing of the oversized message is relayed"
                    return records.ended is not None

                try:
                    await wait_for(ended, 30, "the relay ending the stream at the oversized frame")
                finally:
                    await records.close()
            _, peak = tracemalloc.get_traced_memory()
            async with http.get(url, headers=auth) as stream:
                records = Records(stream.content)

                async def relayed() -> list[bytes] | None:
                    pub.send_multipart([b"kv-events", (2).to_bytes(8, "big"), b"small"])
                    return await records.next(0.5)

                try:
                    parts = await wait_for(relayed, 30, "a normal message through a new subscription")
                finally:
                    await records.close()
        assert parts == [b"kv-events", (2).to_bytes(8, "big"), b"small"]
    finally:
        tracemalloc.stop()
        await front.close()
        pub.close()
        ctx.term()
    assert peak - baseline < 16 * MIB, f"the relay's memory grew by {peak - baseline}"
