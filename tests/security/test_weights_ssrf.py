"""M3: the weights fetch connects to the address that was checked, not to whatever a second DNS lookup says, and a
download with no declared size stops at the agent's cap."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from llmgw_agent import weights
from llmgw_agent.protocol import ShardSpec, ShardStatus, WeightSource
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import wait_for

BLOB = bytes(range(256)) * 64  # 16 KiB
HOST = "weights.example.test"  # resolved only by the tests' own answers below


class BlobServer:
    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.hits = 0

    async def blob(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(body=BLOB)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/m.gguf", self.blob)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]


@pytest.fixture
async def server() -> AsyncIterator[BlobServer]:
    srv = BlobServer()
    await srv.start()
    yield srv
    assert srv.runner is not None
    await srv.runner.cleanup()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def part_files(directory: Path) -> list[Path]:
    return list(directory.rglob("*.part"))


def _info(address: str, port: int) -> tuple[Any, ...]:
    return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))


async def test_m3_fetch_connects_to_the_address_that_was_checked(
    server: BlobServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name answers loopback (allowed) first and the metadata address on every later lookup.
    The agent must look the name up once and connect to that answer: the fetch succeeds from loopback and the
    name was looked up exactly once. (Checking with one lookup and connecting with another reaches
    169.254.169.254.)"""
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo
    answers: list[str] = []

    async def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if host != HOST:
            return await real(host, port, *args, **kwargs)
        address = "127.0.0.1" if not answers else "169.254.169.254"
        answers.append(address)
        return [_info(address, int(port or 0))]

    monkeypatch.setattr(loop, "getaddrinfo", rebinding)
    url = f"http://{HOST}:{server.port}/m.gguf"
    path = await weights.resolve(WeightSource(url=url, size=len(BLOB)), tmp_path, lambda d, t: None)
    assert _read(path) == BLOB and server.hits == 1
    assert answers == ["127.0.0.1"]


class FlippingResolver(AbstractResolver):
    """Gives each answer of `answers` in turn, one per call: a name whose records change between lookups."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return [
            ResolveResult(
                hostname=host, host=a, port=port, family=family, proto=0, flags=socket.AI_NUMERICHOST
            )
            for a in addresses
        ]

    async def close(self) -> None:
        pass


async def test_m3_resolver_answer_checked_is_the_one_connected_to(server: BlobServer, tmp_path: Path) -> None:
    resolver = FlippingResolver(["127.0.0.1"], ["169.254.169.254"])
    url = f"http://{HOST}:{server.port}/m.gguf"
    path = await weights.resolve(WeightSource(url=url), tmp_path, lambda d, t: None, resolver=resolver)
    assert _read(path) == BLOB
    assert resolver.calls == 1


@pytest.mark.parametrize(
    "addresses", [["169.254.169.254"], ["127.0.0.1", "169.254.169.254"], ["fd00:ec2::254"]], ids=str
)
async def test_m3_a_name_resolving_to_a_metadata_address_is_refused(
    server: BlobServer, tmp_path: Path, addresses: list[str]
) -> None:
    """Every answer is checked, not only the first: aiohttp may try any of them."""
    resolver = FlippingResolver(addresses)
    url = f"http://{HOST}:{server.port}/m.gguf"
    with pytest.raises(weights.WeightsError, match="resolves to"):
        await weights.resolve(WeightSource(url=url), tmp_path, lambda d, t: None, resolver=resolver)
    assert server.hits == 0 and not part_files(tmp_path)


async def test_m3_download_without_size_stops_at_the_cap(server: BlobServer, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{server.port}/m.gguf"
    with pytest.raises(weights.WeightsError, match="more than 1000 bytes with no size_bytes declared"):
        await weights.resolve(WeightSource(url=url), tmp_path, lambda d, t: None, max_bytes=1000)
    assert not part_files(tmp_path) and not weights.cache_path(tmp_path, url).exists()


@pytest.mark.integration
async def test_m3_agent_setting_caps_a_download_with_no_declared_size(
    server: BlobServer, tmp_path: Path
) -> None:
    """The cap is the agent's `max_download_bytes`: a shard whose download passes it fails and says why."""
    updates: list[ShardStatus] = []
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        max_download_bytes=4096,
    )
    sup = Supervisor(cfg, updates.append)
    try:
        url = f"http://127.0.0.1:{server.port}/m.gguf"
        sup.start(ShardSpec(replica_id="capped", model="m", engine="llamacpp", source=WeightSource(url=url)))
        failed = await wait_for(
            lambda: next((u for u in updates if u.state == "failed"), None), 30, "failure"
        )
        assert "more than 4096 bytes" in failed.message
    finally:
        await sup.stop_all()
        await sup.close()
