"""The API listener's accept loop (llmgw_router/server/accept.py): one wake-up takes every connection waiting, each
becomes a connection of the protocol, and binding a name binds each of its addresses on one port."""

from __future__ import annotations

import asyncio
import socket

from llmgw_router.server import accept


class Counting(asyncio.Protocol):
    made: list[Counting] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Counting.made.append(self)
        self.transport = transport


async def test_one_wake_up_takes_every_waiting_connection() -> None:
    Counting.made = []
    (listening,) = accept.bind("127.0.0.1", 0)
    acceptor = accept.Acceptor([listening], Counting)
    port = listening.getsockname()[1]
    loop = asyncio.get_running_loop()
    loop.remove_reader(listening.fileno())  # drive the accept by hand: what one wake-up does
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]  # queued by the kernel
    try:
        acceptor._accept(listening)
        assert len(acceptor._handing) + len(Counting.made) == 40  # all taken in that one call
        for _ in range(50):
            if len(Counting.made) == 40:
                break
            await asyncio.sleep(0)
        assert len(Counting.made) == 40
    finally:
        for c in clients:
            c.close()
        for p in Counting.made:
            p.transport.close()
        await acceptor.close()


def test_a_name_is_bound_on_each_of_its_addresses_on_one_port() -> None:
    socks = accept.bind("localhost", 0)
    try:
        ports = {s.getsockname()[1] for s in socks}
        families = {s.family for s in socks}
        expected = {info[0] for info in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
        assert len(ports) == 1 and families == expected
    finally:
        for s in socks:
            s.close()
