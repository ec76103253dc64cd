"""The mirror is tried first and the origin only for a file the mirror lacks (404); an air-gapped node is sent
only the mirror; the origin token reaches the origin's host only and never a log or an error. What the node is
sent is core.fetch_plan's (the controller's rule), fetched by the agent against two real servers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llmgw_agent import dirfetch
from llmgw_agent.protocol import WeightFile, WeightSource
from llmgw_agent.weights import WeightsError

from llmgw.core.config.models import MirrorSettings, Source
from llmgw.core.weights.fetch_plan import weight_source
from llmgw.core.weights.manifest import ManifestFile

from .file_server import FileServer, model_files, sha

PREFIX = "/org/model/resolve/abc123/"
TOKEN = "hf_SeCrEtToKeN0123456789"
NODE = {"Authorization": "Bearer node-token"}
LACKING = "model-00002-of-00002.safetensors"


@pytest.fixture
async def servers() -> AsyncIterator[tuple[FileServer, FileServer]]:
    files = model_files()
    mirror = FileServer(files={PREFIX + n: b for n, b in files.items() if n != LACKING})
    origin = FileServer(files={PREFIX + n: b for n, b in files.items()})
    await mirror.start()
    await origin.start()
    yield mirror, origin
    await mirror.stop()
    await origin.stop()


def listed() -> list[ManifestFile]:
    return [ManifestFile(n, len(b), sha(b)) for n, b in model_files().items()]


def plan(mirror: FileServer, origin: FileServer, *, airgapped: bool = False) -> WeightSource:
    src = Source.model_validate({"repo": "org/model", "revision": "abc123", "token": {"env": "HF_TOKEN"}})
    settings = MirrorSettings(url=mirror.base, origin=origin.base)
    return weight_source(src, settings, airgapped=airgapped, manifest=listed(), token=TOKEN)


async def test_mirror_first_origin_only_for_what_it_lacks_and_the_token_only_there(
    servers: tuple[FileServer, FileServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mirror, origin = servers
    caplog.set_level(logging.DEBUG)
    source = plan(mirror, origin)
    path = await dirfetch.resolve_directory(
        source, tmp_path, lambda d, t: None, mirror_headers=lambda url: NODE
    )
    for name, body in model_files().items():
        assert (Path(path) / name).read_bytes() == body
    assert {s.path for s in mirror.seen} == {
        PREFIX + n for n in model_files()
    }  # every file asked there first
    assert [s.path for s in origin.seen] == [PREFIX + LACKING]
    assert {s.auth for s in mirror.seen} == {"Bearer node-token"}  # the mirror never sees the origin token
    assert {s.auth for s in origin.seen} == {f"Bearer {TOKEN}"}
    assert TOKEN not in caplog.text and "node-token" not in caplog.text
    assert TOKEN not in repr(source)


async def test_an_airgapped_node_uses_only_the_mirror(
    servers: tuple[FileServer, FileServer], tmp_path: Path
) -> None:
    mirror, origin = servers
    source = plan(mirror, origin, airgapped=True)
    with pytest.raises(WeightsError, match=f"model file {LACKING}: not at the mirror") as caught:
        await dirfetch.resolve_directory(source, tmp_path, lambda d, t: None)
    assert origin.seen == []
    assert TOKEN not in str(caught.value)
    listed_files = [WeightFile(name=f.name, size=f.size, sha256=f.sha256) for f in listed()]
    assert not (dirfetch.directory_root(tmp_path, "org/model@abc123", listed_files) / "model").exists()


async def test_the_token_is_not_followed_to_another_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = model_files()
    cdn = FileServer(files={"/blobs/" + n: b for n, b in files.items()})
    await cdn.start()
    origin = FileServer(redirects={PREFIX + n: f"{cdn.base}/blobs/{n}" for n in files})
    await origin.start()
    caplog.set_level(logging.DEBUG)
    try:
        src = Source(repo="org/model", revision="abc123")
        source = weight_source(
            src, MirrorSettings(origin=origin.base), airgapped=False, manifest=listed(), token=TOKEN
        )
        await dirfetch.resolve_directory(source, tmp_path, lambda d, t: None)
    finally:
        await cdn.stop()
        await origin.stop()
    assert {s.auth for s in origin.seen} == {f"Bearer {TOKEN}"}
    # 127.0.0.1 on another port is another origin: the CDN is asked without the token.
    assert cdn.seen and {s.auth for s in cdn.seen} == {None}
    assert TOKEN not in caplog.text


async def test_an_origin_error_names_the_url_never_the_token(tmp_path: Path) -> None:
    origin = FileServer(files={PREFIX + n: b"" for n in model_files()})  # every file empty: sizes differ
    await origin.start()
    try:
        src = Source(repo="org/model", revision="abc123")
        source = weight_source(
            src, MirrorSettings(origin=origin.base), airgapped=False, manifest=listed(), token=TOKEN
        )
        with pytest.raises(WeightsError) as caught:
            await dirfetch.resolve_directory(source, tmp_path, lambda d, t: None)
    finally:
        await origin.stop()
    assert origin.base in str(caught.value) and TOKEN not in str(caught.value)


def test_no_mirror_and_no_origin_is_nowhere_to_fetch_from() -> None:
    src = Source(repo="org/model")
    with pytest.raises(ValueError, match="nowhere to fetch it from"):
        weight_source(src, MirrorSettings(origin="none"), airgapped=False, manifest=None, token=None)
    with pytest.raises(ValueError, match="air-gapped"):
        weight_source(src, MirrorSettings(), airgapped=True, manifest=None, token=None)
