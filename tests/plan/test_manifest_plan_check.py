"""`llmgw plan` checks each new or changed weights source against its servers: real llmgw mirrors on loopback
(llmgw.adapters.mirror, serving HEAD with the HF headers) stand for the Cluster's mirror and for the origin, and
the CLI runs with a saved live state. A missing file or a wrong size or digest is a plan error naming the model,
the source's file:line:col and the URL; offline or unreachable is "not checked: ...", never a silent pass; an
unchanged source is not asked again."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from agent.file_server import model_files, sha
from aiohttp import web
from support import free_port
from typer.testing import CliRunner

from llmgw.adapters.mirror import MirrorStore, hash_directory, manifest_text, mirror_app
from llmgw.adapters.repo_files import load_repo
from llmgw.cli.main import app
from llmgw.core.fleet.views import LiveState
from llmgw.core.plan import catalog_documents

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: tiny}
spec:
  context_length: 4096
  source: {repo: org/tiny, revision: REV, manifest: manifests/tiny.json}
  profiles: [{name: sim, engine: sim}]
"""
WHERE = "models.yaml:6:11"  # spec.source's value in MODEL
CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: test}
spec:
  mirror: {url: 'MIRROR', origin: 'ORIGIN'}
"""


@dataclass
class Server:
    """A real mirror (HF layout, Range, HEAD, X-Linked-Etag), recording each request's method and path."""

    root: Path
    url: str = ""
    seen: list[tuple[str, str]] = field(default_factory=list)
    runner: web.AppRunner | None = None

    async def start(self) -> None:
        served = mirror_app(self.root, lambda _token: True)

        @web.middleware
        async def record(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            self.seen.append((request.method, request.path))
            return await handler(request)

        served.middlewares.append(record)
        self.runner = web.AppRunner(served)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[tuple[Server, Server]]:
    source = tmp_path / "hf" / "tiny"
    for name, body in model_files().items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(body)
    MirrorStore(tmp_path / "mirror").add_directory(source, "org/tiny", "v1")
    MirrorStore(tmp_path / "origin").add_directory(source, "org/tiny", "v1")
    MirrorStore(tmp_path / "origin").add_directory(source, "org/tiny", "v2")  # the mirror lacks v2
    mirror, origin = Server(tmp_path / "mirror"), Server(tmp_path / "origin")
    await mirror.start()
    await origin.start()
    yield mirror, origin
    for s in (mirror, origin):
        assert s.runner is not None
        await s.runner.cleanup()


def write_repo(root: Path, mirror: str, origin: str, manifest: str, rev: str = "v1") -> Path:
    (root / "manifests").mkdir(parents=True, exist_ok=True)
    (root / "cluster.yaml").write_text(CLUSTER.replace("MIRROR", mirror).replace("ORIGIN", origin))
    (root / "models.yaml").write_text(MODEL.replace("REV", rev))
    (root / "manifests" / "tiny.json").write_text(manifest)
    return root


def good_manifest(tmp_path: Path) -> str:
    return manifest_text(hash_directory(tmp_path / "hf" / "tiny"))


def empty_state(path: Path, live: LiveState | None = None) -> Path:
    path.write_text((live or LiveState()).model_dump_json())
    return path


async def plan(repo: Path, state: Path, *extra: str) -> tuple[int, str, str]:
    args = ["plan", str(repo), "--state", str(state), *extra]
    result = await asyncio.to_thread(CliRunner().invoke, app, args)
    return result.exit_code, result.stdout, result.stderr


async def test_a_directory_source_is_checked_file_by_file_at_the_mirror(
    tmp_path: Path, servers: tuple[Server, Server]
) -> None:
    mirror, origin = servers
    repo = write_repo(tmp_path / "repo", mirror.url, "none", good_manifest(tmp_path))
    code, out, err = await plan(repo, empty_state(tmp_path / "state.json"))
    assert code == 0, err
    total = sum(len(b) for b in model_files().values())
    assert f"checked: org/tiny@v1 (tiny): 4 files, {total} bytes as the repo says, at {mirror.url}" in out
    assert out.rstrip().endswith("Weights sources: 1 checked.")
    heads = sorted(p for m, p in mirror.seen if m == "HEAD")
    assert heads == sorted(f"/org/tiny/resolve/v1/{n}" for n in model_files())  # one HEAD a file, no GET
    assert not origin.seen


async def test_a_missing_file_or_a_wrong_size_is_a_plan_error_naming_model_place_and_url(
    tmp_path: Path, servers: tuple[Server, Server]
) -> None:
    mirror, _ = servers
    files = json.loads(good_manifest(tmp_path))["files"]
    config = next(f for f in files if f["name"] == "config.json")
    config["size"] += 1
    files.append({"name": "model-00003-of-00003.safetensors", "size": 5, "sha256": "c" * 64})
    repo = write_repo(tmp_path / "repo", mirror.url, "none", json.dumps({"files": files}))
    code, out, err = await plan(repo, empty_state(tmp_path / "state.json"), "--out", str(tmp_path / "p.json"))
    assert code == 1
    base = f"{mirror.url}/org/tiny/resolve/v1/"
    size = len(model_files()["config.json"])
    where = f"{repo}/{WHERE}: spec.source: model tiny: "
    assert f"{where}config.json: {base}config.json is {size} bytes, the repo says {size + 1}" in err
    missing = "model-00003-of-00003.safetensors"
    assert f"{where}{missing}: not at {base}{missing} (HTTP 404)" in err
    assert "the plan was not saved" in err and not (tmp_path / "p.json").exists()
    assert "Weights sources: 1 wrong." in out


async def test_the_origin_is_asked_only_for_what_the_mirror_lacks(
    tmp_path: Path, servers: tuple[Server, Server]
) -> None:
    mirror, origin = servers
    repo = write_repo(tmp_path / "repo", mirror.url, origin.url, good_manifest(tmp_path), rev="v2")
    code, out, err = await plan(repo, empty_state(tmp_path / "state.json"))
    assert code == 0, err
    assert "checked: org/tiny@v2 (tiny): 4 files" in out and f"at {origin.url}" in out
    asked_mirror = {p for m, p in mirror.seen if m == "HEAD"}
    asked_origin = {p for m, p in origin.seen if m == "HEAD"}
    assert asked_mirror == asked_origin == {f"/org/tiny/resolve/v2/{n}" for n in model_files()}
    # And through a mirror that has it, the origin is never asked.
    origin.seen.clear()
    write_repo(repo, mirror.url, origin.url, good_manifest(tmp_path), rev="v1")
    assert (await plan(repo, empty_state(tmp_path / "state.json")))[0] == 0
    assert not origin.seen


async def test_a_file_sources_size_and_the_digest_the_server_names_are_compared(
    tmp_path: Path, servers: tuple[Server, Server]
) -> None:
    mirror, _ = servers
    body = model_files()["config.json"]
    url = f"{mirror.url}/org/tiny/resolve/v1/config.json"
    repo = write_repo(tmp_path / "repo", mirror.url, "none", good_manifest(tmp_path))
    model = MODEL.replace("{repo: org/tiny, revision: REV, manifest: manifests/tiny.json}", "SOURCE")
    for sha256, size, ok in ((sha(body), len(body), True), ("e" * 64, len(body), False)):
        (repo / "models.yaml").write_text(
            model.replace("SOURCE", f"{{url: '{url}', sha256: {sha256}, size_bytes: {size}}}")
        )
        code, out, err = await plan(repo, empty_state(tmp_path / "state.json"))
        if ok:
            assert code == 0 and f"checked: {url} (tiny): 1 file, {len(body)} bytes" in out, err
        else:
            assert code == 1
            assert f"config.json: {url} has sha256 {sha(body)}, the repo says {'e' * 64}" in err


async def test_offline_or_unreachable_says_not_checked_and_never_passes_silently(
    tmp_path: Path, servers: tuple[Server, Server]
) -> None:
    mirror, _ = servers
    repo = write_repo(tmp_path / "repo", mirror.url, "none", good_manifest(tmp_path))
    state = empty_state(tmp_path / "state.json")
    code, out, _ = await plan(repo, state, "--offline")
    assert code == 0 and not mirror.seen
    assert "not checked: org/tiny@v1 (tiny): --offline: no server was asked" in out
    assert "Weights sources: 1 not checked." in out
    closed = f"http://127.0.0.1:{free_port()}"
    write_repo(repo, closed, "none", good_manifest(tmp_path))
    code, out, err = await plan(repo, state, "--format", "json")
    assert code == 0, err
    (verdict,) = json.loads(out)["sources"]
    assert verdict["state"] == "not checked" and verdict["model"] == "tiny"
    assert re.match(
        rf"{closed}/org/tiny/resolve/v1/\S+: no answer \(.+\) \(4 of 4 files\)$", verdict["detail"]
    )


async def test_an_unchanged_source_is_not_asked_again_and_an_edited_manifest_is(
    tmp_path: Path, servers: tuple[Server, Server]
) -> None:
    mirror, _ = servers
    repo = write_repo(tmp_path / "repo", mirror.url, "none", good_manifest(tmp_path))
    loaded = load_repo(repo)
    assert loaded.repo is not None
    catalog = loaded.repo.catalog
    applied = LiveState(
        models={n: m.spec for n, m in catalog.models.items()}, documents=catalog_documents(catalog)
    )
    state = empty_state(tmp_path / "state.json", applied)
    code, out, _ = await plan(repo, state)
    assert code == 0 and "Weights sources" not in out and not mirror.seen
    # The same path, other bytes: the spec is unchanged, the manifest is not, so it is checked again.
    files = json.loads(good_manifest(tmp_path))["files"]
    files[0]["size"] += 1
    (repo / "manifests" / "tiny.json").write_text(json.dumps({"files": files}))
    code, out, err = await plan(repo, state)
    assert code == 1 and mirror.seen and f"the repo says {files[0]['size']}" in err


async def test_a_directory_without_a_repo_manifest_is_checked_against_the_published_one(
    tmp_path: Path, servers: tuple[Server, Server]
) -> None:
    mirror, _ = servers
    repo = write_repo(tmp_path / "repo", mirror.url, "none", good_manifest(tmp_path))
    (repo / "models.yaml").write_text(
        MODEL.replace("REV", "v1").replace(", manifest: manifests/tiny.json", "")
    )
    shutil.rmtree(repo / "manifests")
    code, out, err = await plan(repo, empty_state(tmp_path / "state.json"))
    assert code == 0, err
    assert "checked: org/tiny@v1 (tiny): 4 files" in out
    assert ("GET", "/org/tiny/resolve/v1/llmgw-manifest.json") in mirror.seen
    (repo / "models.yaml").write_text(
        (repo / "models.yaml").read_text().replace("revision: v1", "revision: v9")
    )
    code, _, err = await plan(repo, empty_state(tmp_path / "state.json"))
    assert code == 1
    assert f"no llmgw-manifest.json at {mirror.url}/org/tiny/resolve/v9/llmgw-manifest.json" in err
