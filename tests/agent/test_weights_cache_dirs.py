"""Published directory sources in the agent's weights index: fetched for real from a loopback file server
(tests/agent/file_server.py), recorded by name and manifest digest, reported with their size, kept while
a declared source names them, and collected whole (published model and any staging) once none does. A
directory the index names but the cache did not publish is never deleted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llmgw_agent import dirfetch
from llmgw_agent.cache_index import WeightsIndex
from llmgw_agent.protocol import FetchBase, WeightSource, manifest_digest

from .file_server import FileServer, model_files, sha

PREFIX = "/org/model/resolve/main/"
NAME = "org/model@main"


@pytest.fixture
async def origin() -> AsyncIterator[FileServer]:
    srv = FileServer(files={PREFIX + name: body for name, body in model_files().items()})
    await srv.start()
    yield srv
    await srv.stop()


def digest() -> str:
    return manifest_digest((n, len(b), sha(b)) for n, b in model_files().items())


async def fetched(srv: FileServer, cache: Path, index: WeightsIndex, shard: str) -> dirfetch.Published:
    source = WeightSource(directory=NAME, bases=[FetchBase(url=srv.base + PREFIX, kind="origin")])
    srv.files[PREFIX + "llmgw-manifest.json"] = (
        b'{"files": ['
        + b",".join(
            f'{{"name": "{n}", "size": {len(b)}, "sha256": "{sha(b)}"}}'.encode()
            for n, b in model_files().items()
        )
        + b"]}"
    )
    published = await dirfetch.fetch_directory(source, cache, lambda _d, _t: None)
    index.record_directory(NAME, published.digest, published.path, shard)
    return published


async def test_a_published_directory_is_reported_by_name_and_digest_and_survives_a_restart(
    origin: FileServer, tmp_path: Path
) -> None:
    cache = tmp_path / "weights"
    index = WeightsIndex(tmp_path / "index.json", cache)
    published = await fetched(origin, cache, index, "tiny-1-0")
    assert published.digest == digest()  # the manifest the server published, in any order
    (entry,) = index.report()
    assert (entry.directory, entry.manifest_sha256, entry.fetched) == (NAME, digest(), True)
    assert (entry.url, entry.path, entry.sha256) == (None, None, None)
    assert entry.size_bytes == sum(len(b) for b in model_files().values())
    assert entry.local_path == published.path and entry.used_by == ["tiny-1"]
    again = WeightsIndex(tmp_path / "index.json", cache)  # the agent restarted
    assert [(e.directory, e.manifest_sha256) for e in again.report()] == [(NAME, digest())]


async def test_kept_while_named_collected_whole_once_not(origin: FileServer, tmp_path: Path) -> None:
    cache = tmp_path / "weights"
    index = WeightsIndex(tmp_path / "index.json", cache)
    published = Path((await fetched(origin, cache, index, "tiny-1-0")).path)
    (published.parent / "staging").mkdir()  # what an interrupted later fetch would leave
    by_digest = WeightSource(directory=NAME, manifest_sha256=digest())
    by_name = WeightSource(directory=NAME)
    assert index.collect([], dry_run=False)["removed"] == []  # a running shard uses it
    index.release("tiny-1-0")
    for keep in (by_digest, by_name):
        assert index.collect([keep], dry_run=False)["removed"] == [], keep
    # The name is declared with other bytes (its repo manifest changed): these are collectable.
    moved_on = WeightSource(directory=NAME, manifest_sha256="e" * 64)
    dry = index.collect([moved_on], dry_run=True)
    assert [r["directory"] for r in dry["removed"]] == [NAME]
    assert await asyncio.to_thread(published.is_dir)
    done = index.collect([moved_on], dry_run=False)
    assert [(r["directory"], r["local_path"]) for r in done["removed"]] == [(NAME, str(published))]
    assert not await asyncio.to_thread(published.parent.exists)
    assert index.report() == []


async def test_an_index_entry_pointing_outside_the_caches_directories_is_never_deleted(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "weights"
    precious = tmp_path / "elsewhere" / "model"
    (precious / "sub").mkdir(parents=True)
    (precious / "sub" / "keep.bin").write_bytes(b"x")
    lookalike = cache / "dir-notahash" / "model"
    lookalike.mkdir(parents=True)
    index = WeightsIndex(tmp_path / "index.json", cache)
    index.record_directory("a@v1", "1" * 64, str(precious), "a-1-0")
    index.record_directory("b@v1", "2" * 64, str(lookalike), "b-1-0")
    index.release("a-1-0")
    index.release("b-1-0")
    result = index.collect([], dry_run=False)
    assert result["removed"] == []
    assert sorted(r["local_path"] for r in result["refused"]) == sorted([str(precious), str(lookalike)])
    assert all("not where the cache publishes a directory" in r["reason"] for r in result["refused"])
    assert (precious / "sub" / "keep.bin").read_bytes() == b"x" and lookalike.is_dir()
