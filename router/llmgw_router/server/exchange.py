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

__all__ = ["ClientStalled", "Exchange", "Headers", "Reply", "json_reply"]


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
class Reply:
    """A whole answer: status, body bytes (sent as they are) and headers (Content-Type among them)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def json_reply(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})


class Exchange(Protocol):
    """One request and its answer. `read_body` raises the 413 ApiError itself when the body is over `limit`
    (before reading it all when the length is declared). `write` and `write_eof` wait while the client's
    TCP window is full, at most `limit_s` seconds (then the connection is aborted and ClientStalled raised);
    to a client that went away they raise ConnectionResetError."""

    method: str
    path: str
    headers: Headers

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

    def respond(self, reply: Reply) -> None: ...
    def start_stream(self, status: int, headers: dict[str, str]) -> None: ...
    async def write(self, chunk: bytes, limit_s: float) -> None: ...
    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        """End the stream, `last` its final bytes (sent with the end, in one write)."""
        ...

    def abort(self) -> None: ...
