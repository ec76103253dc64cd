"""One request on a client connection, and its answer: the listener's `Exchange` (server/exchange.py).

The connection (listener.py's `_Connection`) parses the request into it and feeds it the body; the request
path reads the body and answers through it, whole or as a stream, with the head written as HTTP/1.1 wants it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

from llmgw_router.server import peers
from llmgw_router.server.errors import ApiError
from llmgw_router.server.exchange import AS_SENT, Headers, HttpReply

__all__ = ["ClientConnection", "HttpExchange", "response_head"]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n" for s in HTTPStatus}
_BAD_HEADER_CHARS = ("\r", "\n", "\0")


class ClientConnection(Protocol):
    """What an exchange needs of its connection (listener.py's `_Connection`)."""

    remote: str | None
    closed: bool
    closing: bool  # answer what is in hand, then close
    write_paused: bool  # the client's TCP window is full
    transport: asyncio.Transport

    def authenticated(self) -> None: ...
    def body_timeout(self) -> float: ...
    async def drain(self, limit_s: float) -> None: ...


_date_cache: tuple[int, str] = (0, "")


def _date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True))
    return _date_cache[1]


def response_head(status: int, headers: Mapping[str, str], framing: str, close: bool) -> bytes:
    line = _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n"
    # One scan of every value at once (three `in` on a joined string), not a generator per header: the
    # common head has ten fields and none of them holds a bad character.
    values = "".join(headers.values())
    if "\r" in values or "\n" in values or "\0" in values:
        # A value taken from a request (a field name in x-llmgw-dropped-fields) must not split the head.
        headers = {name: _clean(value) for name, value in headers.items()}
    fields = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    end = "Connection: close\r\n\r\n" if close else "\r\n"
    return f"{line}Date: {_date()}\r\n{fields}{framing}{end}".encode("utf-8", "surrogateescape")


def _clean(value: str) -> str:
    for c in _BAD_HEADER_CHARS:
        value = value.replace(c, " ")
    return value


class HttpExchange:
    """One request on a connection, and its answer (implements exchange.Exchange)."""

    __slots__ = (
        "_chunked",
        "_conn",
        "_expect_continue",
        "_pending_head",
        "_waiter",
        "chunks",
        "complete",
        "content_length",
        "finished",
        "head_only",
        "headers",
        "http10",
        "keep_alive",
        "method",
        "path",
        "size",
        "started",
        "timed_out",
        "too_big",
    )

    surface = AS_SENT  # the client's request as it came: no surface translates it

    def __init__(self, conn: ClientConnection) -> None:
        self._conn = conn
        self.method = ""
        self.path = ""
        self.headers = Headers()
        self.keep_alive = True
        self.http10 = False
        self.content_length: int | None = None
        self.too_big = False
        self.size = 0
        self.chunks: list[bytes] = []
        self.complete = False
        self._waiter: asyncio.Future[None] | None = None
        self._expect_continue = False
        self.started = False
        self._chunked = False
        self._pending_head = b""  # a stream's head, sent with its first bytes: one send(2), not two
        self.finished = False  # the whole answer went out
        self.head_only = False  # HEAD: the answer's head without its body
        self.timed_out = False  # the body did not arrive within its deadline: answered 408, never read

    @property
    def remote(self) -> str | None:
        return self._conn.remote

    def _too_large(self, limit: int) -> ApiError:
        self.keep_alive = False  # the rest of the body is not read as a next request
        return ApiError(413, f"Request body larger than {limit} bytes.", "request_too_large")

    def authenticated(self) -> None:
        self._conn.authenticated()

    def _too_slow(self) -> ApiError:
        seconds = self._conn.body_timeout()
        return ApiError(
            408,
            f"The request body did not arrive in time ({seconds:g} s after the head, plus 1 s per "
            f"{peers.BODY_MIN_RATE // 1024} KiB received).",
            "request_timeout",
        )

    async def read_body(self, limit: int) -> bytes:
        if self.too_big or (self.content_length is not None and self.content_length > limit):
            raise self._too_large(limit)
        if self.timed_out:
            raise self._too_slow()
        if not self.complete:
            if self._conn.closed:
                raise ConnectionResetError("the client went away")
            if self._expect_continue:
                self._expect_continue = False
                self._conn.transport.write(_CONTINUE)
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            if self.timed_out:
                raise self._too_slow()
            if self.too_big:
                raise self._too_large(limit)
        if self.size > limit:
            raise self._too_large(limit)
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _closes(self) -> bool:
        return not (self.keep_alive and self.complete) or self._conn.closing

    def respond(self, reply: HttpReply) -> None:
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the client went away")
        body = reply.body
        head = response_head(reply.status, reply.headers, f"Content-Length: {len(body)}\r\n", self._closes())
        self.started = self.finished = True
        if self.head_only:
            conn.transport.write(head)
        elif len(body) < 16384:
            conn.transport.write(head + body)
        else:  # not copied into one buffer: the engine's bytes go out as they came
            conn.transport.write(head)
            conn.transport.write(body)

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the client went away")
        if self.http10:  # no chunked encoding in HTTP/1.0: the stream ends when the connection does
            self.keep_alive = False
            framing = ""
        else:
            self._chunked = True
            framing = "Transfer-Encoding: chunked\r\n"
        self.started = True
        self._pending_head = response_head(status, headers, framing, self._closes())

    async def write(self, chunk: bytes, limit_s: float) -> None:
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the client went away")
        if not chunk:
            return
        data = b"%x\r\n%b\r\n" % (len(chunk), chunk) if self._chunked else chunk
        if self._pending_head:
            data = self._pending_head + data
            self._pending_head = b""
        conn.transport.write(data)
        if conn.write_paused:
            await conn.drain(limit_s)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the client went away")
        data = self._pending_head
        self._pending_head = b""
        if last:
            data += b"%x\r\n%b\r\n" % (len(last), last) if self._chunked else last
        if self._chunked:
            data += b"0\r\n\r\n"
        if data:
            conn.transport.write(data)
        self.finished = True
        if conn.write_paused:
            await conn.drain(limit_s)

    def abort(self) -> None:
        self._conn.transport.abort()  # drop what is queued for the client: nothing more is sent to it

    # ------------------------------------------------------------------ fed by the connection

    def _body_done(self) -> None:
        self.complete = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _gone(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client went away"))

    def _body_expired(self) -> None:
        self.timed_out = True
        self.keep_alive = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)  # read_body raises the 408
