"""What the request path needs of one HTTP exchange with a client, whatever server carries it.

The request path (service.py, proxy.py) reads the method, path, headers and body and answers whole or as a
stream; it never sees the server's own request type. `listener.py` implements this for the API listener;
anything else that can do these few things could carry the same path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmgw.core.errors import LlmgwError

__all__ = [
    "AS_SENT",
    "ClientStalled",
    "Exchange",
    "Headers",
    "HttpReply",
    "Surface",
    "WrappedExchange",
    "json_reply",
]


class ClientStalled(LlmgwError, ConnectionResetError):
    """The client accepted none of a write for the write timeout: treated as gone (it is cut off)."""


class Headers(dict[str, str]):
    """Request headers under lower-case names; `get` and `in` take any case. The first of repeated fields
    wins (the strict parser already refused repeated framing fields)."""

    __slots__ = ()

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())


@dataclass(slots=True)
class HttpReply:
    """A whole answer: status, body bytes (sent as they are) and headers (Content-Type among them)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def json_reply(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> HttpReply:
    return HttpReply(
        status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})}
    )


@dataclass(frozen=True, slots=True)
class Surface:
    """What the API a client called asks of the request path, beside the chat it is served as."""

    name: str  # "as sent" (the client's request goes to the engine as it came), "responses", "messages"
    # Its answer may be stored and replayed (a Responses turn's is rebuilt from its kept state: not cached).
    cacheable: bool = True
    # A redacted chat body is what the engine gets (a Responses turn is rebuilt per engine from its own input,
    # so a redaction of the chat it became would not reach the engine).
    redacts_in_place: bool = True
    # Its streams are translated event by event into another API's events: no place for a chat error event,
    # so an output guardrail cannot cut one.
    streams_translated: bool = False


AS_SENT = Surface("as sent")


class Exchange(Protocol):
    """One request and its answer. `read_body` raises the 413 ApiError itself when the body is over `limit`
    (before reading it all when the length is declared). `write` and `write_eof` wait while the client's
    TCP window is full, at most `limit_s` seconds (then the connection is aborted and ClientStalled raised);
    to a client that went away they raise ConnectionResetError."""

    method: str
    path: str
    headers: Headers
    surface: Surface

    @property
    def remote(self) -> str | None: ...

    @property
    def started(self) -> bool:
        """An answer (whole, or a stream's head) has gone out."""
        ...

    async def read_body(self, limit: int) -> bytes: ...
    def authenticated(self) -> None:
        """The request's key was accepted: its connection no longer counts as anonymous (listener.py)."""
        ...

    def respond(self, reply: HttpReply) -> None: ...
    def start_stream(self, status: int, headers: dict[str, str]) -> None: ...
    async def write(self, chunk: bytes, limit_s: float) -> None: ...
    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        """End the stream, `last` its final bytes (sent with the end, in one write)."""
        ...

    def abort(self) -> None: ...


class WrappedExchange:
    """An Exchange around another (the client's): everything passes through to `inner` unless a subclass
    overrides it. The Messages and Responses surfaces, the response cache's recorder and the output guardrails'
    stream each change a few of these, and only those."""

    surface: Surface = AS_SENT

    def __init__(self, inner: Exchange) -> None:
        self.inner = inner
        self.method: str = inner.method
        self.path: str = inner.path
        self.headers: Headers = inner.headers
        self.surface = inner.surface

    @property
    def remote(self) -> str | None:
        return self.inner.remote

    @property
    def started(self) -> bool:
        return self.inner.started

    def authenticated(self) -> None:
        self.inner.authenticated()

    async def read_body(self, limit: int) -> bytes:
        return await self.inner.read_body(limit)

    def respond(self, reply: HttpReply) -> None:
        self.inner.respond(reply)

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        self.inner.start_stream(status, headers)

    async def write(self, chunk: bytes, limit_s: float) -> None:
        await self.inner.write(chunk, limit_s)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        await self.inner.write_eof(limit_s, last)

    def abort(self) -> None:
        self.inner.abort()
