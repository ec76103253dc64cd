"""A small HTTP/1.1 client for the router's calls to engines: POST a JSON body over a pooled keep-alive
connection and read the answer whole or as it arrives.

Why not aiohttp's client, which the router uses for everything else (providers, scraping, the controller)?
Cost per call. Measured on this project's 2-core machine against the benchmark's mock engine: about 70 µs
of CPU per request through aiohttp.ClientSession, about 20 µs through this client. The request path makes
one such call per request, so that difference is a fifth of the router's whole cost per request.

Deliberately narrow: plain `http://` only (engines on the cluster network; providers over TLS go through
aiohttp), POST only, no redirects, no proxies, no compression (the router asks for none). Responses may be
Content-Length, chunked or closed-delimited. A connection goes back to the pool only after its response was
read to the end with keep-alive; anything unexpected closes it.

Strict by design, because an engine (or a proxy in front of one) may be buggy or compromised: Content-Length
is digits only, Content-Length together with Transfer-Encoding is refused (RFC 9112 §6.3: such a message may
be smuggling, and its connection is never reused), chunk sizes are hex digits only, the head, a trailer
section and a body read whole are capped, each request has an overall deadline besides the idle timeout, and
a pooled connection that received bytes while idle is dropped (they would be parsed as the next answer).

Back-pressure: while more than `_PAUSE_ABOVE` bytes wait unread in a connection's buffer, reading from the
socket is paused, so a client of the router that stops reading stops the engine (through TCP) instead of
growing the router's memory.

Every new connection goes to an address checked against `forbidden_address_reason` after resolving the
name (a literal such as `2852039166` is 169.254.169.254 to getaddrinfo), and the checked address is the one
connected to, so no later resolution can differ.

Errors are `UpstreamHttpError` (an OSError, never a ConnectionResetError: that one means the *client* of
the router went away) or TimeoutError.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from aiohappyeyeballs import AddrInfoType

from llmgw.core.errors import LlmgwError
from llmgw_router.upstream.egress import checked_addresses

__all__ = ["EngineClient", "EngineResponse", "UpstreamHttpError"]

_MAX_HEAD = 64 * 1024  # status line and headers; an engine's are a few hundred bytes
_MAX_TRAILER = 8 * 1024  # trailer section after the last chunk; engines send none
_MAX_BODY = 64 * 1024 * 1024  # a body read whole (non-stream answers); an embedding batch is a few MiB
_MAX_CHUNK_LINE = 1024
_PAUSE_ABOVE = 64 * 1024  # unread bytes in a connection's buffer before the socket is paused
_RESUME_BELOW = 16 * 1024
_SOCKET_RCVBUF = 64 * 1024
_DIGITS = re.compile(rb"[0-9]+")  # not int(): it takes "+3", "-3", "1_0" and spaces
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")  # not int(x, 16): it takes "0x3", "+3", "_"


class UpstreamHttpError(LlmgwError, OSError):
    """The engine's connection failed or it answered something that is not HTTP/1.1."""


class _StaleConnection(UpstreamHttpError):
    """A pooled connection turned out closed before any answer: the engine never saw the request."""


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: str
    host_header: str

    @property
    def request_line(self) -> bytes:
        """The request line and Host, the same for every request to this URL (kept with the target)."""
        return f"POST {self.path} HTTP/1.1\r\nHost: {self.host_header}\r\n".encode("latin-1")


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"EngineClient serves plain http:// URLs only, got {url!r}")
    port = parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host_header = parts.netloc.rpartition("@")[2]
    return _Target(parts.hostname, port, path, host_header)


def _header_lines(headers: dict[str, str]) -> bytes:
    # A value with a line break would start a header (or a request) of its own. One scan of all the names
    # and all the values (a few `in` on two joined strings) instead of a generator per header.
    names, values = "".join(headers), "".join(headers.values())
    if any(c in values for c in "\r\n\0") or any(c in names for c in "\r\n\0: "):
        bad = next(
            n for n, v in headers.items() if any(c in v for c in "\r\n\0") or any(c in n for c in "\r\n\0: ")
        )
        raise ValueError(f"header {bad!r} has a character that is not allowed in HTTP")
    return "".join([f"{name}: {value}\r\n" for name, value in headers.items()]).encode("latin-1")


def _time_out(waiter: asyncio.Future[None], seconds: float) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"no bytes from the engine for {seconds:g}s"))


class _Connection(asyncio.Protocol):
    """One TCP connection: bytes in a buffer, a future to wake the reader, EOF and errors remembered."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.idle_since = 0.0  # when it went back to the pool
        self.paused = False  # reading from the socket is paused: the buffer is over _PAUSE_ABOVE
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > _PAUSE_ABOVE and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def drained(self) -> None:
        """The reader took bytes out of the buffer: read from the socket again once it is low."""
        if self.paused and len(self.buf) < _RESUME_BELOW and self.transport is not None:
            self.paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None and self.error is None:
            self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def usable(self) -> bool:
        return not self.eof and self.transport is not None and not self.transport.is_closing()

    async def wait_for_data(self, idle_limit: float, deadline: float) -> None:
        """Return when more bytes arrived or the connection ended; TimeoutError after `idle_limit` seconds of
        silence or at `deadline` (the loop's clock), whichever is first."""
        if self.eof:
            raise UpstreamHttpError(self._ended())
        loop = asyncio.get_running_loop()
        left = deadline - loop.time()
        if left <= 0:
            raise TimeoutError("the engine's answer took longer than the request deadline")
        self.drained()  # waiting with a full buffer would wait forever
        waiter = self._waiter = loop.create_future()
        # A timer that fails the waiter, not asyncio.timeout: the same TimeoutError in the caller, without
        # the context manager's cancel-and-uncancel of the task (a few us on every wait for an answer).
        limit = min(idle_limit, left)
        timer = loop.call_later(limit, _time_out, waiter, limit)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _ended(self) -> str:
        return f"connection closed by the engine ({self.error})" if self.error else "connection closed"

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.eof = True


class EngineResponse:
    """The engine's answer: status and headers at once, the body through `read`/`readany`. Release it
    (or use `async with`) so its connection goes back to the pool."""

    def __init__(
        self,
        client: EngineClient,
        conn: _Connection,
        status: int,
        headers: dict[str, str],
        deadline: float = float("inf"),
    ) -> None:
        self.status = status
        self.headers = headers  # names lower-cased
        self._client = client
        self._conn: _Connection | None = conn
        self._deadline = deadline  # the loop's clock: the whole answer must be in by then
        self._keep_alive = headers.get("connection", "").lower() != "close"
        length = headers.get("content-length")
        coding = headers.get("transfer-encoding")
        if coding is not None and length is not None:
            # RFC 9112 §6.3: a sender of both is broken or smuggling; the caller closes the connection.
            raise UpstreamHttpError("the engine sent both Content-Length and Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            raise UpstreamHttpError(f"unsupported Transfer-Encoding {coding[:40]!r} (only chunked)")
        self._chunked = coding is not None
        self._left: int | None = None  # Content-Length body: bytes still to come
        self._chunk_left = 0  # chunked body: bytes left in the current chunk (then its CRLF)
        self._done = status in (204, 304)
        if not self._chunked and not self._done:
            if length is not None:
                if not _DIGITS.fullmatch(length.encode("latin-1")):
                    raise UpstreamHttpError(f"bad Content-Length {length[:40]!r} (digits only)")
                self._left = int(length)
                self._done = self._left == 0
            else:
                self._keep_alive = False  # the body ends when the engine closes the connection

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    async def readany(self) -> bytes:
        """Some body bytes, waiting for them if none are in; b"" once the body is complete."""
        while True:
            if self._done:
                return b""
            conn = self._conn
            if conn is None:
                raise UpstreamHttpError("the response was closed")
            data = self._take(conn)
            if data:
                return data
            if self._done:
                return b""
            if conn.eof and not self._chunked and self._left is None:
                self._done = True  # closed-delimited body: EOF is its end
                return b""
            await conn.wait_for_data(self._client.read_timeout, self._deadline)

    async def read(self, limit: int = _MAX_BODY) -> bytes:
        """The whole body; UpstreamHttpError when it is longer than `limit` bytes (a non-stream answer of an
        engine is small: this bounds what a broken one can make the router hold)."""
        if self._left is not None and self._left > limit:
            raise UpstreamHttpError(f"the engine's body of {self._left} bytes is over the {limit}-byte limit")
        parts = []
        size = 0
        while data := await self.readany():
            size += len(data)
            if size > limit:
                raise UpstreamHttpError(f"the engine's body is over the {limit}-byte limit")
            parts.append(data)
        return b"".join(parts)

    def _take(self, conn: _Connection) -> bytes:
        buf = conn.buf
        if not buf:
            return b""
        try:
            if not self._chunked:
                if self._left is None:
                    data = bytes(buf)
                    buf.clear()
                    return data
                data = bytes(buf[: self._left])
                del buf[: len(data)]
                self._left -= len(data)
                self._done = self._left == 0
                return data
            return self._take_chunks(buf)
        finally:
            conn.drained()

    def _take_chunks(self, buf: bytearray) -> bytes:
        out = bytearray()
        while buf:
            if self._chunk_left > 0:
                n = min(self._chunk_left, len(buf))
                out += buf[:n]
                del buf[:n]
                self._chunk_left -= n
                if self._chunk_left == 0:
                    self._chunk_left = -1  # its CRLF comes next
                continue
            if self._chunk_left == -1:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise UpstreamHttpError("chunked body: a chunk is not followed by CRLF")
                del buf[:2]
                self._chunk_left = 0
                continue
            end = buf.find(b"\r\n", 0, _MAX_CHUNK_LINE + 2)
            if end < 0:
                if len(buf) > _MAX_CHUNK_LINE:
                    raise UpstreamHttpError("chunked body: chunk size line too long")
                break
            # chunk-size [ BWS ";" extension ]: the size is hex digits and nothing else.
            size_text = bytes(buf[:end]).split(b";", 1)[0].rstrip(b" \t")
            if not _HEX.fullmatch(size_text):
                raise UpstreamHttpError(f"chunked body: bad chunk size {size_text[:20]!r} (hex digits only)")
            size = int(size_text, 16)
            if size == 0:
                # The last chunk: skip any trailers up to the empty line that ends the message.
                if buf[end : end + 4] == b"\r\n\r\n":
                    trailer_end = end
                else:
                    trailer_end = buf.find(b"\r\n\r\n", end, end + _MAX_TRAILER + 4)
                if trailer_end < 0:
                    if len(buf) - end > _MAX_TRAILER:
                        raise UpstreamHttpError(f"chunked body: trailer section over {_MAX_TRAILER} bytes")
                    break  # not all here yet
                del buf[: trailer_end + 4]
                self._done = True
                break
            del buf[: end + 2]
            self._chunk_left = size
        return bytes(out)

    def release(self) -> None:
        """Done with the response: the connection is reused if the body was read to its end (the end may be
        in the buffer unread, as after a stream's [DONE]: it is consumed here, without waiting)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if not self._done and conn.buf:
            try:
                self._take(conn)
            except UpstreamHttpError:
                conn.close()
                return
        if self._done and self._keep_alive and not conn.buf and conn.usable:
            self._client._put_back(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Drop the connection (the engine sees it close and can stop generating)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def __aenter__(self) -> EngineResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.release()
        else:
            self.close()


class EngineClient:
    """Pooled keep-alive connections per engine address. One per router process; close() at shutdown."""

    def __init__(
        self,
        connect_timeout: float,
        read_timeout: float,
        max_idle_per_engine: int = 256,
        idle_timeout: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        request_deadline: float = 3600.0,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout  # idle: the longest silence while an answer is expected
        # From sending the request to the end of its answer, however steadily the bytes come: an engine
        # dribbling a byte a minute would otherwise hold a request (and its endpoint slot) forever.
        self.request_deadline = request_deadline
        self._max_idle = max_idle_per_engine
        # An idle connection older than this is not reused (aiohttp's keep-alive default too): a node that
        # vanished without closing its sockets would otherwise take a request into a read timeout.
        self._idle_timeout = idle_timeout
        self._clock = clock
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
        self._targets: dict[str, tuple[_Target, bytes]] = {}
        self._closed = False

    @staticmethod
    def handles(url: str) -> bool:
        return url.startswith("http://")

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> EngineResponse:
        """Send the request and return once the status line and headers are in."""
        found = self._targets.get(url)
        if found is None:
            if len(self._targets) > 10_000:
                self._targets.clear()
            target = _target(url)
            found = self._targets[url] = (target, target.request_line)
        target, request_line = found
        length = b"Content-Length: %d\r\n" % len(body)
        message = b"".join((request_line, length, _header_lines(headers), b"\r\n", body))
        deadline = asyncio.get_running_loop().time() + self.request_deadline
        conn = self._take_idle((target.host, target.port))
        if conn is not None:
            try:
                return await self._exchange(conn, message, reused=True, deadline=deadline)
            except _StaleConnection:
                # The engine closed this idle connection as we picked it up (its keep-alive timeout): the
                # request never reached it, so sending it on a fresh connection is safe.
                pass
        conn = await self._connect(target)
        return await self._exchange(conn, message, reused=False, deadline=deadline)

    async def _exchange(
        self, conn: _Connection, message: bytes, reused: bool, deadline: float
    ) -> EngineResponse:
        assert conn.transport is not None
        conn.transport.write(message)
        try:
            while True:
                end = conn.buf.find(b"\r\n\r\n", 0, _MAX_HEAD)
                if end >= 0:
                    status, headers = _parse_head(bytes(conn.buf[:end]))
                    del conn.buf[: end + 4]
                    if 100 <= status < 200:
                        continue  # an interim answer (100 Continue): the real one follows
                    return EngineResponse(self, conn, status, headers, deadline)
                if len(conn.buf) > _MAX_HEAD:
                    raise UpstreamHttpError(f"the engine's response head is over {_MAX_HEAD} bytes")
                if conn.eof:
                    stale = reused and not conn.buf and not isinstance(conn.error, TimeoutError)
                    raise (_StaleConnection if stale else UpstreamHttpError)(conn._ended())
                await conn.wait_for_data(self.read_timeout, deadline)
        except BaseException:
            conn.close()
            raise

    async def _connect(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        key = (target.host, target.port)
        try:
            async with asyncio.timeout(self.connect_timeout):
                infos = await checked_addresses(loop, target.host, target.port)
                for i, info in enumerate(infos):  # in order, as create_connection would
                    try:
                        sock = await _open_socket(loop, info)
                        _transport, conn = await loop.create_connection(lambda: _Connection(key), sock=sock)
                        break
                    except OSError:
                        if i == len(infos) - 1:
                            raise
        except OSError as exc:
            raise UpstreamHttpError(
                f"connect to {target.host}:{target.port} failed: {exc.strerror or exc}"
            ) from None
        return conn

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have been timed out
            if self._clock() - conn.idle_since > self._idle_timeout:
                idle.append(conn)  # it and every one older: put back only to be closed with them
                for old in idle:
                    old.close()
                idle.clear()
                return None
            if conn.usable and not conn.buf:
                return conn
            # Closed, or bytes arrived while it sat idle (a stray CRLF, a proxy's 408): those would be read
            # as the next request's answer.
            conn.close()
        return None

    def _put_back(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        idle = self._idle.setdefault(conn.key, deque())
        if len(idle) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = self._clock()
        idle.append(conn)

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def _open_socket(loop: asyncio.AbstractEventLoop, info: AddrInfoType) -> socket.socket:
    """A connected socket whose receive buffer is fixed at _SOCKET_RCVBUF: with reading paused, the kernel
    would otherwise grow it (tcp_rmem allows tens of MiB) and hold for a stalled stream what the router
    itself no longer does. An engine's stream is far slower than what that window allows on a LAN."""
    family, type_, proto, _, sockaddr = info
    sock = socket.socket(family, type_, proto)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_RCVBUF)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


_WHITESPACE = " \t\r\n\x0b\x0c"  # what bytes.strip() strips; str.strip() would also take \x85 and \xa0


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    # Decoded once (latin-1 maps each byte to one character), then split and stripped as text: the same
    # result as doing it per line on bytes, a third cheaper.
    text = head.decode("latin-1")
    status_line, more, fields = text.partition("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise UpstreamHttpError(f"not an HTTP/1.1 answer: {status_line[:40].encode('latin-1')!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise UpstreamHttpError(f"bad status line {status_line[:40].encode('latin-1')!r}") from None
    headers: dict[str, str] = {}
    for line in fields.split("\r\n") if more else ():
        name, sep, value = line.partition(":")
        if not sep:
            raise UpstreamHttpError(f"bad header line {line[:40].encode('latin-1')!r}")
        key = name.strip(_WHITESPACE).lower()
        value = value.strip(_WHITESPACE)
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if parts[0] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers.setdefault("connection", "close")
    return status, headers
