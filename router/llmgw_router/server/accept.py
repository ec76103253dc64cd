"""The API listener's accept loop: at each wake-up of its listening sockets, every connection waiting is taken.

Why not `loop.create_server`: under uvloop, at concurrency 64 on the shared 2-core machine, a new client
connection waited up to 1.6 s between its handshake and the router's `connection_made` (the kernel's
`tcpi_last_data_recv` read at that moment), while the loop served the connections it already had, so the
first request of a connection made at a busy time ended up in the p99 (1.1-1.5 s in 3-second wrk runs, and
wrk timeouts past 2 s). The same router on asyncio's loop, whose server accepts up to its backlog at each
wake-up, had a p99 of 260-325 ms in the same run, as the aiohttp floor did. Here the listening sockets are
plain non-blocking sockets read with `add_reader`, drained with `accept()` up to ACCEPT_BATCH a wake-up, and
each connection handed to the loop with `connect_accepted_socket`, which under uvloop keeps its transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

__all__ = ["ACCEPT_BATCH", "Acceptor", "bind"]

log = logging.getLogger(__name__)

ACCEPT_BATCH = 256  # connections taken per wake-up at most: the loop's other work is not starved either
BACKLOG = 1024
TLS_HANDSHAKE_TIMEOUT = 10.0  # a client that opens a connection and never finishes its handshake is dropped


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for host:port, one per address it resolves to, as `loop.create_server` binds them
    (SO_REUSEADDR; an IPv6 socket takes IPv6 only, so `::` and `0.0.0.0` can both be bound)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _name, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr[0], port, *addr[2:]))
            if port == 0:  # every further address on the one port the first was given
                port = int(sock.getsockname()[1])
        return socks
    except OSError:
        for sock in socks:
            sock.close()
        raise


class Acceptor:
    """Accepts on `socks` (bound; listened on here) and hands each connection to `factory`'s protocol, over TLS
    when given a server context (the handshake is the loop's, before the protocol sees a byte)."""

    def __init__(
        self,
        socks: list[socket.socket],
        factory: Callable[[], asyncio.Protocol],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.sockets = socks
        self._factory = factory
        self._tls = tls
        self._loop = asyncio.get_running_loop()
        self._handing: set[asyncio.Task[object]] = set()  # connections being handed to the loop
        self._refused_logged = False
        for sock in socks:
            sock.setblocking(False)
            sock.listen(BACKLOG)
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _peer = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, most likely: the kernel keeps the rest queued
                if not self._refused_logged:
                    log.warning("cannot accept connections on the API port: %s", exc)
                    self._refused_logged = True
                return
            if self._refused_logged:
                log.warning("accepting connections on the API port again")
                self._refused_logged = False
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._hand_over(conn))
            self._handing.add(task)
            task.add_done_callback(self._handing.discard)

    async def _hand_over(self, conn: socket.socket) -> None:
        try:
            if self._tls is None:
                await self._loop.connect_accepted_socket(self._factory, conn)
            else:
                await self._loop.connect_accepted_socket(
                    self._factory, conn, ssl=self._tls, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT
                )
        except (OSError, TimeoutError) as exc:  # the client left (or never finished its handshake)
            log.debug("a connection went away as it was accepted: %s", exc)
            conn.close()

    async def close(self) -> None:
        """Stop accepting and close the listening sockets; connections already accepted stay."""
        for sock in self.sockets:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
            sock.close()
        if self._handing:
            await asyncio.wait(list(self._handing), timeout=1.0)
