"""Weights: cache by source hash, .part then rename, Range resume, size/sha256 checks, refused addresses."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from llmgw_agent import weights
from llmgw_agent.protocol import ShardSpec, ShardStatus, WeightSource
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import free_port_range, wait_for

from .helpers import part_files, read_bytes

BLOB = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(BLOB).hexdigest()


class FileServer:
    def __init__(self) -> None:
        self.ranges: list[str | None] = []
        self.runner: web.AppRunner | None = None
        self.base = ""

    async def blob(self, request: web.Request) -> web.Response:
        rng = request.headers.get("Range")
        self.ranges.append(rng)
        if rng:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(BLOB):
                return web.Response(status=416)
            return web.Response(status=206, body=BLOB[start:])
        return web.Response(body=BLOB)

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/models/blob.gguf", self.blob)
        app.router.add_get("/redirect", self.redirect)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.base


@pytest.fixture
async def server() -> AsyncIterator[FileServer]:
    srv = FileServer()
    await srv.start()
    yield srv
    assert srv.runner is not None
    await srv.runner.cleanup()


async def test_download_to_hashed_cache_with_progress(server: FileServer, tmp_path: Path) -> None:
    url = f"{server.base}/models/blob.gguf"
    progress: list[tuple[int, int | None]] = []
    path = await weights.resolve(
        WeightSource(url=url, sha256=SHA, size=len(BLOB)), tmp_path, lambda d, t: progress.append((d, t))
    )
    assert Path(path) == weights.cache_path(tmp_path, url) and read_bytes(path) == BLOB
    assert Path(path).parent.name == hashlib.sha256(url.encode()).hexdigest()[:24]
    assert not part_files(tmp_path)
    assert progress[-1] == (len(BLOB), len(BLOB))
    # A second resolve uses the cache: no request.
    await weights.resolve(WeightSource(url=url, sha256=SHA), tmp_path, lambda d, t: None)
    assert server.ranges == [None]


async def test_resume_with_range(server: FileServer, tmp_path: Path) -> None:
    url = f"{server.base}/models/blob.gguf"
    final = weights.cache_path(tmp_path, url)
    final.parent.mkdir(parents=True)
    final.with_name(final.name + ".part").write_bytes(BLOB[:1000])
    path = await weights.resolve(WeightSource(url=url, sha256=SHA), tmp_path, lambda d, t: None)
    assert server.ranges == ["bytes=1000-"]
    assert read_bytes(path) == BLOB


async def test_checksum_mismatch_removes_only_its_own_part(server: FileServer, tmp_path: Path) -> None:
    url = f"{server.base}/models/blob.gguf"
    with pytest.raises(weights.WeightsError, match="sha256"):
        await weights.resolve(WeightSource(url=url, sha256="0" * 64), tmp_path, lambda d, t: None)
    assert not weights.cache_path(tmp_path, url).exists()
    assert not part_files(tmp_path)
    with pytest.raises(weights.WeightsError, match="size"):
        await weights.resolve(WeightSource(url=url, size=5), tmp_path, lambda d, t: None)


async def test_local_path_used_in_place_and_never_deleted(tmp_path: Path) -> None:
    local = tmp_path / "mine.gguf"
    local.write_bytes(BLOB)
    assert await weights.resolve(
        WeightSource(path=str(local), sha256=SHA), tmp_path / "c", lambda d, t: None
    ) == str(local)
    with pytest.raises(weights.WeightsError, match="sha256"):
        await weights.resolve(
            WeightSource(path=str(local), sha256="0" * 64), tmp_path / "c", lambda d, t: None
        )
    assert local.read_bytes() == BLOB  # a bad checksum never deletes what the agent did not fetch
    with pytest.raises(weights.WeightsError, match="does not exist"):
        await weights.resolve(WeightSource(path=str(tmp_path / "nope")), tmp_path, lambda d, t: None)


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/x",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://[::ffff:169.254.169.254]/x",
        "file:///etc/passwd",
    ],
)
async def test_refused_sources(url: str, tmp_path: Path) -> None:
    with pytest.raises(weights.WeightsError):
        await weights.resolve(WeightSource(url=url), tmp_path, lambda d, t: None)


async def test_redirect_to_metadata_refused(server: FileServer, tmp_path: Path) -> None:
    with pytest.raises(weights.WeightsError, match="link-local"):
        await weights.resolve(WeightSource(url=f"{server.base}/redirect"), tmp_path, lambda d, t: None)


@pytest.mark.integration
async def test_fetch_progress_on_shard_status(server: FileServer, tmp_path: Path) -> None:
    updates: list[ShardStatus] = []
    ports = free_port_range(100)
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        port_range=(ports, ports + 99),
    )
    sup = Supervisor(cfg, updates.append)
    source = WeightSource(url=f"{server.base}/models/blob.gguf", sha256=SHA, size=len(BLOB))
    spec = ShardSpec(replica_id="w", model="m", engine="sim", source=source)
    try:
        first = sup.start(spec)
        assert first.state == "fetching"
        ready = await wait_for(
            lambda: next((u for u in updates if u.state in ("ready", "failed")), None), limit_s=20
        )
        assert ready.state == "ready", ready.message
        assert ready.fetch_bytes_done == len(BLOB) and ready.fetch_bytes_total == len(BLOB)
    finally:
        await sup.stop_all()
        await sup.close()
