"""The API listener: HTTP/1.1 over an asyncio.Protocol, requests parsed by `httptools` (llhttp, the C parser
uvicorn uses), one handler task per request, run under uvloop when it is installed.

Why not aiohttp's server, or uvicorn or granian? Server CPU per request on one tiny path, measured with wrk
(docs/router.md, "The listener"): aiohttp web 66-89 µs, uvicorn+httptools (ASGI) 48 µs, granian (RSGI,
embedded) 49 µs, this shape 15 µs. What it does itself is only what the router's path needs, and every
rule is here in one place:

- strict parsing is llhttp's (no lenient flags): CR/LF/NUL in header values, Content-Length together with
  Transfer-Encoding, bad chunk sizes are refused; on top, the target, the header count and the head's size
  are capped (414, 431). A malformed request is answered 400 in OpenAI's error shape with
  `Connection: close`, and logged as one warning line.
- the body limit is applied as the body arrives: a declared length over it is refused before a byte is
  read, a chunked body is dropped (not kept) as soon as it passes the limit. The rest of a refused body is
  read and discarded for at most `linger` seconds after the answer, so the client sees the 413 instead of
  a reset.
- keep-alive for HTTP/1.1 unless `Connection: close`; HTTP/1.0 is answered and closed. Pipelined requests
  are answered in order, one at a time (reading pauses while one waits behind another).
- `head_timeout` seconds from a request's first byte to the end of its head (slowloris), then the rules'
  `body_timeout` (plus a second per 16 KiB received) to the end of its body, each answered 408 and closed
  on expiry; `idle_timeout` between requests on a kept-alive connection.
- connections no request with a valid key has come on yet are capped per client and in all (peers.py): at
  a cap the oldest of them is closed to admit the new one. A handler calls `authenticated()` once a key
  was accepted; the connection stops counting for as long as it stays open.
- a client that goes away cancels its handler (and so the engine call), as aiohttp's handler_cancellation.
- writes wait while the client's TCP window is full (the transport's high-water mark), bounded by the
  caller's write timeout (exchange.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

import httptools

from llmgw.core.errors import LlmgwError
from llmgw_router.server import accept, peers
from llmgw_router.server.errors import ApiError, error_body, error_response
from llmgw_router.server.exchange import ClientStalled, Exchange, HttpReply
from llmgw_router.server.http_exchange import HttpExchange, response_head

__all__ = ["ApiListener", "Handler", "HttpExchange"]

log = logging.getLogger(__name__)

Handler = Callable[[Exchange], Awaitable[None]]

MAX_TARGET = 8 * 1024  # request target; the API's are a few dozen bytes
MAX_HEAD = 64 * 1024  # header names and values together
MAX_HEADERS = 100
# Header names as sent, to their lower-case text: the same few dozen on every request, looked up once each
# instead of decoded and lowered per field (a field's callback is the listener's largest cost per request).
# Bounded in count and length: names a client makes up past the bound, or longer than any real header's, are
# decoded each time, never kept (512 kept names of 64 KiB each would hold 32 MiB for the process's life).
_NAMES: dict[bytes, str] = {}
_NAMES_KEPT = 512
_NAME_KEPT_BYTES = 64
_WRITE_HIGH = 64 * 1024  # bytes queued for a client before writers wait (aiohttp's figure)


class _Refused(LlmgwError):
    """A request the listener itself refuses before any handler runs (its status and the words)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Connection(asyncio.Protocol):
    """One client connection: feeds the parser, queues requests in order, runs one handler at a time."""

    def __init__(self, listener: ApiListener) -> None:
        self.listener = listener
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.parser = httptools.HttpRequestParser(self)
        self.remote: str | None = None
        self.closed = False
        self.closing = False  # answer what is in hand, then close
        self.write_paused = False
        self._drain: list[asyncio.Future[None]] = []
        self._current: HttpExchange | None = None  # being parsed
        self._url: list[bytes] = []
        self._head_size = 0
        self._cap = 0
        self._queue: deque[HttpExchange | HttpReply] = deque()
        self._running: asyncio.Task[None] | None = None
        self._read_paused = False
        self._lingering = False
        self._deadline: float | None = None  # the idle wait's, head's or body's end (the listener's sweep)
        self._awaiting = _IDLE  # what the deadline waits for
        self.peer: str | None = None  # the client counted against the caps: the remote, or who a proxy named
        self.via_proxy = False  # the remote is a trusted proxy
        self.is_authenticated = False  # a request with a valid key came on this connection

    def body_timeout(self) -> float:
        """Seconds from a request's head to the end of its body (before the per-KiB allowance)."""
        return self.listener.rules().body_timeout

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else None
        self.listener.connections.add(self)
        self._arm(self.listener.idle_timeout, _IDLE)
        if self.listener.rules().trusted(self.remote):
            self.via_proxy = True  # counted under the client it names, once a head does
        else:
            self.peer = self.remote or "unknown"
            self.listener._admit(self)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a refused request: read and dropped
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.closing = True  # no protocol switch here: answer what was parsed, then close
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refused):
                self._refuse(cause.status, str(cause))
            else:
                self._refuse(400, f"Malformed HTTP request: {exc}.")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.listener._lost(self)
        self.listener.unauthenticated.discard(self)
        self._deadline = None
        for fut in self._drain:
            if not fut.done():
                fut.set_exception(ConnectionResetError("the client went away"))
        self._drain.clear()
        if self._current is not None:
            self._current._gone()
        if self._running is not None:
            self._running.cancel()  # the client left: its handler (and so its engine call) stops
        self._queue.clear()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        for fut in self._drain:
            if not fut.done():
                fut.set_result(None)
        self._drain.clear()

    async def drain(self, limit_s: float) -> None:
        fut = self.loop.create_future()
        self._drain.append(fut)
        try:
            async with asyncio.timeout(limit_s):
                await fut
        except TimeoutError:
            self.transport.abort()  # drop what is queued for the client: nothing more is sent to it
            raise ClientStalled(f"the client read nothing for {limit_s:g}s") from None

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._current = HttpExchange(self)
        self._url = []
        self._head_size = 0
        self._arm(self.listener.head_timeout, _HEAD)

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._head_size += len(url)
        if self._head_size > MAX_TARGET:
            raise _Refused(414, f"Request target longer than {MAX_TARGET} bytes.")

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self._current
        assert ex is not None
        self._head_size += len(name) + len(value)
        if self._head_size > MAX_HEAD or len(ex.headers) >= MAX_HEADERS:
            raise _Refused(431, f"Request head over {MAX_HEADERS} fields or {MAX_HEAD} bytes.")
        text = _NAMES.get(name)
        if text is None:
            text = name.decode("latin-1").lower()
            if len(_NAMES) < _NAMES_KEPT and len(name) <= _NAME_KEPT_BYTES:
                _NAMES[name] = text
        ex.headers.setdefault(text, value.decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        ex = self._current
        assert ex is not None
        parser = self.parser
        ex.method = parser.get_method().decode("ascii")
        ex.http10 = parser.get_http_version() == "1.0"
        ex.keep_alive = parser.should_keep_alive() and not ex.http10
        target = self._url[0] if len(self._url) == 1 else b"".join(self._url)
        ex.path = target.partition(b"?")[0].decode("latin-1")
        headers = ex.headers
        coding = dict.get(headers, "transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # llhttp takes `gzip, chunked`; the router would pass on a body it cannot read.
            raise _Refused(400, "Transfer-Encoding other than `chunked` is not accepted.")
        length = dict.get(headers, "content-length")
        if length is not None:
            ex.content_length = int(length)  # llhttp took digits only, and one value
        self._cap = self.listener.body_limit()
        if ex.content_length is not None and ex.content_length > self._cap:
            ex.too_big = True
        expect = dict.get(headers, "expect")
        if expect is not None and expect.lower() == "100-continue" and not ex.too_big:
            ex._expect_continue = True
        rules = self.listener.rules()
        self._arm(rules.body_timeout, _BODY)  # the head is in: now its body has a deadline
        if self.via_proxy and not self.is_authenticated:
            client = peers.forwarded_client(headers, rules)
            if client is not None and client != self.peer:
                self.peer = client
                self.listener._admit(self)
        self._queue.append(ex)
        if self._running is None:
            self._next()

    def on_body(self, body: bytes) -> None:
        ex = self._current
        assert ex is not None
        if self._awaiting is _BODY and self._deadline is not None:
            self._deadline += len(body) / peers.BODY_MIN_RATE  # a steady upload earns its time
        if ex.too_big:
            return
        ex.size += len(body)
        if ex.size > self._cap:
            ex.too_big = True  # dropped, not kept: the handler answers 413
            ex.chunks = []
        else:
            ex.chunks.append(body)

    def on_message_complete(self) -> None:
        ex = self._current
        assert ex is not None
        self._current = None
        if self._awaiting is _BODY:
            self._deadline = (
                None  # the request is in: nothing is awaited from the client until it is answered
            )
        ex._body_done()
        if self._queue and not self._read_paused:
            # A whole request waits behind the one being answered: read no further until it is its turn.
            self._read_paused = True
            self.transport.pause_reading()

    # ------------------------------------------------------------------ running requests in order

    def _next(self) -> None:
        item = self._queue.popleft()
        if isinstance(item, HttpReply):
            self._send_refusal(item)
            return
        handler = self.listener.route(item)
        self._running = self.loop.create_task(self._run(item, handler))

    async def _run(self, ex: HttpExchange, handler: Handler) -> None:
        try:
            await handler(ex)
        except asyncio.CancelledError:
            return  # the client went away (connection_lost) or the listener is closing
        except ApiError as err:  # a refusal a handler left to the listener to send
            if not ex.started and not self.closed:
                ex.respond(error_response(err))
        except Exception:
            log.exception("request %s %s failed in the listener", ex.method, ex.path)
            if not ex.started and not self.closed:
                ex.respond(
                    _error_reply(500, "Internal error in the router.", "internal_error", "server_error")
                )
        self._done(ex)

    def _done(self, ex: HttpExchange) -> None:
        self._running = None
        if self.closed:
            return
        if not ex.started:
            ex.respond(_error_reply(500, "The router gave no answer.", "internal_error", "server_error"))
        if (ex.started and not ex.finished) or not ex.keep_alive or self.closing or not ex.complete:
            self._close(linger=not ex.complete and not ex.timed_out)
            return
        if self._queue:
            self._next()
            return
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        self._arm(self.listener.idle_timeout, _IDLE)

    def _refuse(self, status: int, message: str) -> None:
        log.warning("refused a request from %s with %d: %s", self.remote, status, message)
        self._lingering = True  # nothing after a malformed request is parsed
        code = "malformed_request" if status == 400 else "request_head_too_large"
        self._queue.append(_error_reply(status, message, code))
        if self._running is None:
            self._next()

    def _send_refusal(self, reply: HttpReply) -> None:
        head = response_head(reply.status, reply.headers, f"Content-Length: {len(reply.body)}\r\n", True)
        self.transport.write(head + reply.body)
        self._close(linger=True)

    def _close(self, linger: bool) -> None:
        """Close after what is queued is written; with `linger`, first read and drop what the client is
        still sending for a while, so its reset does not destroy the answer before it is read."""
        self._queue.clear()
        if not linger or not self.transport.can_write_eof():
            self.transport.close()
            return
        self._lingering = True
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        self.transport.write_eof()
        self._deadline = None
        self.loop.call_later(self.listener.linger, self.transport.close)

    # ------------------------------------------------------------------ deadlines

    def authenticated(self) -> None:
        """A request with a valid key came on this connection: it no longer counts against the caps."""
        if not self.is_authenticated:
            self.is_authenticated = True
            self.listener.unauthenticated.discard(self)

    def _arm(self, seconds: float, awaiting: str) -> None:
        # A deadline, not a timer: the listener's sweep reads it (no TimerHandle made and cancelled per
        # request).
        self._deadline = self.loop.time() + seconds
        self._awaiting = awaiting

    def _expired(self) -> None:
        self._deadline = None
        if self._awaiting is _BODY and self._current is not None:
            log.info("a request body from %s did not arrive in time: 408", self.remote)
            self._lingering = True  # nothing more of it is parsed
            self.closing = True
            self._current._body_expired()  # its handler answers 408 (read_body) and the connection closes
        elif self._running is not None:
            self.closing = True  # a slow head behind a request in hand: close once that is answered
        elif self._awaiting is _HEAD:
            log.info("a request head from %s did not arrive in time: 408", self.remote)
            self._lingering = True
            reply = _error_reply(408, "The request head did not arrive in time.", "request_timeout")
            self.transport.write(
                response_head(408, reply.headers, f"Content-Length: {len(reply.body)}\r\n", True)
            )
            self.transport.write(reply.body)
            self.transport.close()
        else:
            log.debug("closing a connection from %s: nothing sent in time", self.remote)
            self.transport.close()

    def evict(self) -> None:
        """Closed to make room under a cap (the oldest connection not yet authenticated)."""
        log.debug("closing an unauthenticated connection from %s to admit a newer one", self.peer)
        self.transport.abort()


_IDLE, _HEAD, _BODY = "idle", "head", "body"


_EVICTION_LOG_EVERY = 60.0


def _error_reply(status: int, message: str, code: str, type_: str = "invalid_request_error") -> HttpReply:
    return HttpReply(status, error_body(message, type_, code), {"Content-Type": "application/json"})


class ApiListener:
    """The API server: `routes` maps a path to its methods' handlers; `body_limit` is read at each request's
    head (the snapshot's max_body_bytes)."""

    def __init__(
        self,
        routes: Mapping[str, Mapping[str, Handler]],
        body_limit: Callable[[], int],
        *,
        head_timeout: float = 10.0,
        idle_timeout: float = 75.0,
        linger: float = 10.0,
        rules: Callable[[], peers.ConnectionRules] = peers.ConnectionRules,
    ) -> None:
        self.routes = routes
        # Paths ending in `/*` take whatever follows the prefix (a model id may itself hold slashes).
        self._prefixes = [(p[:-1], m) for p, m in routes.items() if p.endswith("/*")]
        self.body_limit = body_limit
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.linger = linger
        self.rules = rules  # read as connections and heads arrive: the current snapshot's
        self.connections: set[_Connection] = set()
        self.unauthenticated: peers.Unauthenticated[_Connection] = peers.Unauthenticated()
        self.evicted = 0  # connections closed to make room under a cap, since start
        self._evictions_logged = -_EVICTION_LOG_EVERY
        # Anonymous connections may hold at most half the descriptors: the rest stay for authenticated
        # clients, engines, the store and the controller link. Read at start (after main raised the limit).
        self._descriptor_cap = max(1, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2)
        self._acceptor: accept.Acceptor | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        # Deadlines are checked this often: a quarter of the shortest, at most once a second.
        self._sweep_every = min(1.0, head_timeout / 4, idle_timeout / 4)
        self._all_closed: asyncio.Event | None = None  # set by the last connection to go, while closing

    def _admit(self, conn: _Connection) -> None:
        """Count `conn` as not yet authenticated under its peer; close the oldest to stay within the caps."""
        rules = self.rules()
        assert conn.peer is not None
        total = min(rules.max_unauthenticated, self._descriptor_cap)
        evicted = self.unauthenticated.admit(conn, conn.peer, rules.max_unauthenticated_per_peer, total)
        for old in evicted:
            old.evict()
        if evicted:
            self.evicted += len(evicted)
            now = conn.loop.time()
            if now - self._evictions_logged >= _EVICTION_LOG_EVERY:  # one line a minute under a flood
                self._evictions_logged = now
                log.warning(
                    "unauthenticated connections at their cap (%d from %s, %d in all): closing the oldest "
                    "(%d closed since start; spec.router.listener)",
                    self.unauthenticated.count(conn.peer),
                    conn.peer,
                    len(self.unauthenticated),
                    self.evicted,
                )

    def _lost(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._all_closed is not None:
            self._all_closed.set()

    def route(self, ex: HttpExchange) -> Handler:
        methods = self.routes.get(ex.path)
        if methods is None:
            methods = next((m for p, m in self._prefixes if ex.path.startswith(p) and ex.path != p), None)
        if methods is None:
            return _refusal(404, f"No such path: {ex.path[:200]}.", "not_found", {})
        handler = methods.get(ex.method)
        if handler is None and ex.method == "HEAD" and "GET" in methods:
            ex.head_only = True  # a load balancer's health check may ask with HEAD, as aiohttp allowed
            handler = methods["GET"]
        if handler is None:
            allow = {"Allow": ", ".join([*methods, "HEAD"] if "GET" in methods else methods)}
            return _refusal(405, f"{ex.method} is not allowed on {ex.path}.", "method_not_allowed", allow)
        return handler

    async def start(
        self, host: str, port: int, sock: socket.socket | None = None, tls: ssl.SSLContext | None = None
    ) -> int:
        """Listen on `sock` when given (already bound, e.g. with SO_REUSEPORT by a parent), else on
        host:port; over TLS with `tls` (a server context). Returns the port in use."""
        loop = asyncio.get_running_loop()
        # Our own accept loop, not loop.create_server: see llmgw_router/server/accept.py for why.
        socks = [sock] if sock is not None else accept.bind(host, port)
        self._acceptor = accept.Acceptor(socks, lambda: _Connection(self), tls)
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        return int(socks[0].getsockname()[1]) if socks else port

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in list(self.connections):
            deadline = conn._deadline
            if deadline is not None and now >= deadline:
                conn._expired()
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)

    async def close(self, grace: float = 5.0) -> None:
        """Stop accepting; let requests in hand finish for up to `grace` seconds, then cut them off."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._acceptor is not None:
            await self._acceptor.close()
        for conn in list(self.connections):
            conn.closing = True
            if conn._running is None:
                conn.transport.close()
        self._all_closed = asyncio.Event()
        if self.connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._all_closed.wait()
        for conn in list(self.connections):
            conn.transport.abort()
        await asyncio.sleep(0)  # let connection_lost cancel what was cut off


def _refusal(status: int, message: str, code: str, headers: dict[str, str]) -> Handler:
    async def refuse(ex: Exchange) -> None:
        reply = _error_reply(status, message, code)
        reply.headers.update(headers)
        ex.respond(reply)

    return refuse
