"""`llmgw model manifest`, `llmgw mirror add|list` and the read-only HF-layout mirror server, for real: files on
disk, the CLI, and an aiohttp server on loopback asked with aiohttp (Range, tokens, traversal, writes)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from agent.file_server import model_files
from aiohttp import web
from typer.testing import CliRunner

from llmgw.adapters.mirror import MirrorStore, mirror_app
from llmgw.cli.main import app

TOKEN = "node-token-1"


def write_model(root: Path) -> Path:
    for name, body in model_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(body)
    (root / ".gitattributes").write_text("*.safetensors filter=lfs\n")  # not part of the model
    return root


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    mirror = tmp_path / "mirror"
    code, out = cli(
        "mirror",
        "add",
        str(write_model(tmp_path / "src")),
        "--repo",
        "org/model",
        "--mirror-dir",
        str(mirror),
    )
    assert code == 0, out
    runner = web.AppRunner(mirror_app(mirror, lambda t: t == TOKEN))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", mirror
    await runner.cleanup()


def test_manifest_of_a_directory_lists_names_sizes_and_sha256(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "manifest", str(write_model(tmp_path))])
    assert result.exit_code == 0, result.output
    files = {f["name"]: f for f in json.loads(result.stdout)["files"]}
    # A directory without config.json or weights files has no shape to record: said once, on stderr.
    assert "warning: the model's headers were not recorded" in result.stderr
    assert set(files) == set(model_files())  # .gitattributes left out
    for name, body in model_files().items():
        assert files[name]["size"] == len(body) and files[name]["sha256"] == hashlib.sha256(body).hexdigest()


def test_mirror_add_lists_and_refuses_to_replace_a_revision(tmp_path: Path) -> None:
    src, mirror = write_model(tmp_path / "src"), tmp_path / "mirror"
    args = ("mirror", "add", str(src), "--repo", "org/model", "--revision", "v1", "--mirror-dir", str(mirror))
    assert cli(*args)[0] == 0
    code, out = cli(*args)
    assert code == 1 and "already holds org/model@v1" in out
    code, out = cli("mirror", "list", "--mirror-dir", str(mirror), "--json")
    total = sum(len(b) for b in model_files().values())
    origin = f"local directory {src.resolve()}"
    assert json.loads(out) == [
        {
            "repo": "org/model",
            "revision": "v1",
            "files": 4,
            "size_bytes": total,
            "problem": None,
            "origin": origin,
        }
    ]
    (mirror / "org/model/v1/config.json").unlink()  # a file removed by hand is said, not hidden
    assert (
        "config.json is missing"
        in json.loads(cli("mirror", "list", "--mirror-dir", str(mirror), "--json")[1])[0]["problem"]
    )
    assert not list(mirror.glob("org/model/.adding-*"))


async def test_server_answers_range_needs_a_token_and_refuses_traversal_and_writes(
    served: tuple[str, Path],
) -> None:
    base, _ = served
    shard = "model-00001-of-00002.safetensors"
    body = model_files()[shard]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(
            f"{base}/org/model/resolve/main/{shard}", headers={**auth, "Range": "bytes=1000-"}
        ) as r:
            assert r.status == 206 and await r.read() == body[1000:]
        async with http.get(f"{base}/org/model/resolve/main/{shard}") as r:
            assert r.status == 401
        async with http.get(
            f"{base}/org/model/resolve/main/{shard}", headers={"Authorization": "Bearer wrong"}
        ) as r:
            assert r.status == 401
        for bad in (
            "org/model/resolve/main/..%2f..%2fetc/passwd",
            "org/model/resolve/main/../../../etc/passwd",
            "org/model/resolve/main/.hidden",
            "org/model/resolve/nope/config.json",
            "org/model/main/config.json",
        ):
            async with http.get(f"{base}/{bad}", headers=auth) as r:
                assert r.status == 404, bad
        async with http.post(f"{base}/org/model/resolve/main/{shard}", headers=auth, data=b"x") as r:
            assert r.status == 405
        async with http.head(f"{base}/org/model/resolve/main/config.json", headers=auth) as r:
            assert r.status == 200 and r.content_length == len(model_files()["config.json"])


async def test_add_from_a_url_reads_the_manifest_it_publishes(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    base, _ = served
    second = MirrorStore(tmp_path / "second")
    url = f"{base}/org/model/resolve/main/"
    # The first mirror wants a token: without one the published manifest cannot be read, and the error says so.
    with pytest.raises(Exception, match="HTTP 401"):
        await second.add_url(url, "org/model")
    files = await second.add_url(url, "org/model", token=TOKEN)
    assert {f.name for f in files} == set(model_files())
    for name, body in model_files().items():
        assert (tmp_path / "second/org/model/main" / name).read_bytes() == body
    # Where each file was fetched from is kept beside it, with the checksum it arrived with.
    origin = json.loads((tmp_path / "second/org/model/main/llmgw-origin.json").read_text())
    assert origin["origin"] == url
    assert {f["name"]: f["from"] for f in origin["files"]} == {n: url + quote(n) for n in model_files()}
    assert {f["name"]: f["sha256"] for f in origin["files"]} == {f.name: f.sha256 for f in files}


async def test_manifest_of_a_url_without_a_published_one_is_refused_clearly(tmp_path: Path) -> None:
    runner = web.AppRunner(web.Application())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/models/qwen/"
    try:
        code, out = await asyncio.to_thread(cli, "model", "manifest", url)
    finally:
        await runner.cleanup()
    assert code == 1 and "no llmgw-manifest.json" in out and "llmgw model manifest DIR" in out


async def test_the_real_hf_client_downloads_through_the_mirror(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    """What the docs claim of HF_ENDPOINT: `hf_hub_download` (huggingface_hub, a dev dependency) against the
    mirror, with the token it sends as Bearer; the HF model-info API is not served, so no snapshot_download."""
    hub = pytest.importorskip("huggingface_hub")
    base, _ = served
    shard = "model-00001-of-00002.safetensors"
    path = await asyncio.to_thread(
        hub.hf_hub_download,
        "org/model",
        shard,
        revision="main",
        endpoint=base,
        token=TOKEN,
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert await asyncio.to_thread(Path(path).read_bytes) == model_files()[shard]
    with pytest.raises(Exception, match="401"):
        await asyncio.to_thread(
            hub.hf_hub_download,
            "org/model",
            "config.json",
            endpoint=base,
            token="wrong",
            cache_dir=str(tmp_path / "c2"),
        )
