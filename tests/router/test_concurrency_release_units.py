"""Slots free when the answer ends (issue 37), in one process: a stream's concurrency slots go back before its
last bytes are written (so a client that read them and asks again at once finds the slot free), and only
once, whatever ends the request afterwards."""

from __future__ import annotations

import pytest
from llmgw_router.path.ratelimit import LimitGrant, memory_limiter
from llmgw_router.server.errors import ApiError
from llmgw_router.server.exchange import AS_SENT, HttpReply
from llmgw_router.upstream.proxy import UpstreamCall, _stream

from llmgw.core.tenancy.limits import LevelLimits, Tenant
from llmgw.core.tenancy.projects import TenantChain

CHAIN = TenantChain(
    project="p",
    team=None,
    organization="o",
    levels=(
        Tenant("organization", "o", LevelLimits(concurrency=2)),
        Tenant("project", "p", LevelLimits(concurrency=1)),
    ),
)
EVENTS = [
    b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n',
    b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\ndata: [DONE]\n\n',
]


class Engine:
    """An engine's stream, a chunk per read."""

    status = 200

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def header(self, name: str, default: str = "") -> str:
        return default

    async def read(self) -> bytes:
        return b"".join(self.chunks)

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def close(self) -> None:
        return None

    def release(self) -> None:
        return None


class Client:
    """The client's end of the exchange: notes, as each write arrives, whether the lease's slots were back."""

    headers: dict[str, str] = {}
    remote = None
    started = False
    surface = AS_SENT

    def __init__(self, lease: LimitGrant) -> None:
        self.lease = lease
        self.writes: list[tuple[str, bool]] = []

    def _note(self, what: str) -> None:
        assert self.lease.admission is not None
        self.writes.append((what, self.lease.admission.ended))

    async def read_body(self, limit: int) -> bytes:
        return b""

    def authenticated(self) -> None:
        return None

    def respond(self, reply: HttpReply) -> None:
        self._note("respond")

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        self.started = True

    async def write(self, chunk: bytes, limit_s: float) -> None:
        self._note("write")

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        self._note("eof")

    def abort(self) -> None:
        return None


async def test_a_streams_slots_go_back_before_its_last_bytes_and_only_once() -> None:
    limiter = memory_limiter(lambda: 1_000_000.0)
    lease = await limiter.acquire(CHAIN, 10, 0.0)
    client = Client(lease)
    call = UpstreamCall("http://engine/v1/chat/completions", b"{}", {}, True, True, None, {}, False)
    result = await _stream(client, Engine(EVENTS), call, None, 5.0, lambda: limiter.end(lease))  # type: ignore[arg-type]
    assert result.finished
    assert client.writes[-1] == ("eof", True), client.writes
    assert not any(ended for _what, ended in client.writes[:-1]), client.writes
    # The client read the end and asks again at once: the project's one slot is free for it.
    second = await limiter.acquire(CHAIN, 10, 0.0)
    limiter.release(lease, 2, 0.0)  # the first request's settle: nothing more is given back
    with pytest.raises(ApiError) as refused:
        await limiter.acquire(CHAIN, 10, 0.0)
    assert refused.value.status == 429 and "project 'p' has used its 1 concurrent requests" in str(
        refused.value
    )
    limiter.release(second, 0, 0.0)
    await limiter.acquire(CHAIN, 10, 0.0)
