"""The weights mirror: a directory in the HF layout, filled by `llmgw mirror add` and served read-only.

On disk: `ROOT/{repo}/{revision}/{file}` plus `ROOT/{repo}/{revision}/llmgw-manifest.json` (names, sizes,
sha256). Served over HTTP as `GET|HEAD /{repo}/resolve/{revision}/{file}` with Range (aiohttp's FileResponse),
which is what `huggingface_hub` asks of an `HF_ENDPOINT` to download a file; HF's model-info API
(`/api/models/...`) is not served. Nothing writes through the server: `add` is a command on the mirror host.

`add` copies or downloads into a temporary directory beside the target and renames it once every file is there
and verified: a mirror is copied to every node, so a partial version here would be a partial version everywhere.
An existing version is never replaced (a revision names fixed bytes).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aiohttp
from aiohttp import web
from llmgw_agent import dirfetch, repo_rules
from llmgw_agent.origins import ORIGIN_FILE, FileOrigin, OriginRecord, read_record, write_record
from llmgw_agent.protocol import DirectoryManifest, FetchBase, WeightFile, WeightSource
from llmgw_agent.weights import WeightsError, checked_session, following
from pydantic import ValidationError

from llmgw.core.errors import LlmgwError
from llmgw.core.security import bearer_token
from llmgw.core.weights.fetch_plan import DEFAULT_REVISION
from llmgw.core.weights.manifest import ManifestFile, manifest_json
from llmgw.core.weights.model_headers import ModelShape

MANIFEST = repo_rules.MANIFEST_FILE
# Beside the manifest: where each file came from (the URL fetched, the blob or file copied) with its sha256 as
# added, so a version can be traced to its origin after the mirror restarts or moves (llmgw_agent.origins: the
# agents' weights caches keep the same record).
ORIGIN = ORIGIN_FILE
_CHUNK = 1 << 20
_MAX_RECORD_BYTES = 16 * 1024 * 1024


class MirrorError(LlmgwError):
    """A mirror operation that cannot be done; the message says what and why."""


@dataclass(frozen=True)
class MirrorEntry:
    repo: str
    revision: str
    files: int
    size_bytes: int
    problem: str | None  # why the entry is not servable as listed (no manifest, a file missing or resized)
    origin: str | None = None  # where it was added from (its llmgw-origin.json); None: not recorded


@dataclass(frozen=True)
class CheckedFile:
    """A file to add under `name`, with the size and sha256 it must have."""

    name: str
    source: Path
    sha256: str
    size: int


def hash_directory(directory: Path) -> list[ManifestFile]:
    """Every regular file under `directory` with its size and sha256, names relative and `/`-separated.
    Dot-files and dot-directories (.git, .gitattributes, .cache) are not part of a model and are skipped."""
    if not directory.is_dir():
        raise MirrorError(f"{directory}: not a directory")
    out: list[ManifestFile] = []
    for current, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".") and n not in (MANIFEST, ORIGIN)):
            path = Path(current) / name
            if path.is_symlink() or not path.is_file():
                raise MirrorError(f"{path}: not a regular file (links are not copied to nodes)")
            rel = path.relative_to(directory).as_posix()
            problem = repo_rules.manifest_name_problem(rel)
            if problem is not None:
                raise MirrorError(f"{path}: {problem}")
            out.append(ManifestFile(rel, path.stat().st_size, _sha256(path)))
    if not out:
        raise MirrorError(f"{directory}: no files")
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def origin_record(
    origin: str,
    files: list[ManifestFile],
    sources: list[str],
    repo: str | None = None,
    revision: str | None = None,
) -> OriginRecord:
    """The origin record: where the version came from and, per file, what it was copied or fetched from."""
    listed = [FileOrigin.now(f.name, at, f.sha256, f.size) for f, at in zip(files, sources, strict=True)]
    return OriginRecord(origin=origin, repository=repo, revision=revision, files=listed)


def read_origin(version: Path) -> str | None:
    record = read_record(version)
    return None if record is None else record.origin


def manifest_text(files: list[ManifestFile], shape: ModelShape | None = None) -> str:
    return json.dumps(manifest_json(files, shape), indent=1) + "\n"


async def published_manifest(url: str, token: str | None = None) -> list[ManifestFile]:
    """The manifest a server publishes for the directory `url` (URL/llmgw-manifest.json), or MirrorError
    saying it publishes none. The agent's reader, so the CLI and the nodes agree on what a manifest is."""
    if not url.endswith("/"):
        url += "/"
    source = WeightSource(directory=url, bases=[FetchBase(url=url, kind="origin", token=token)])
    try:
        async with checked_session() as session:
            files = await dirfetch.read_manifest(session, source, dirfetch.no_headers)
    except WeightsError as exc:
        raise MirrorError(
            f"{exc} (a URL is described only by the manifest its server publishes; for a local copy run "
            "`llmgw model manifest DIR`)"
        ) from exc
    return [ManifestFile(f.name, f.size, f.sha256) for f in files]


async def published_origin(directory_url: str) -> OriginRecord | None:
    """The origin record a mirror publishes for a version (DIRECTORY/llmgw-origin.json), None when it holds none
    (a version added before the record existed, or a server that is not a mirror); MirrorError when it cannot be
    asked or what it answers is not a record."""
    url = directory_url.rstrip("/") + "/" + ORIGIN
    try:
        async with checked_session() as session, following(session, url) as resp:
            if resp.status == 404:
                return None
            if resp.status != 200:
                raise MirrorError(f"{url}: HTTP {resp.status}")
            body = await resp.content.read(_MAX_RECORD_BYTES + 1)
    except WeightsError as exc:
        raise MirrorError(str(exc)) from exc
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise MirrorError(f"{url}: no answer ({exc or type(exc).__name__})") from exc
    try:
        return OriginRecord.model_validate_json(body[:_MAX_RECORD_BYTES])
    except ValidationError as exc:
        raise MirrorError(f"{url}: not an origin record ({exc.errors()[0]['msg']})") from exc


class MirrorStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def version_dir(self, repo: str, revision: str) -> Path:
        path = self.root / repo / revision
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise MirrorError(f"{repo}@{revision}: would land outside the mirror")
        return path

    def _staging(self, repo: str) -> Path:
        parent = self.root / repo
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".adding-", dir=parent))

    def add_directory(self, source: Path, repo: str, revision: str = DEFAULT_REVISION) -> list[ManifestFile]:
        """Copy a local model directory in, hashing it; the manifest is written beside the files."""
        target = self._free(repo, revision)
        files = hash_directory(source)
        staging = self._staging(repo)
        try:
            for f in files:
                dest = staging / f.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / f.name, dest)
                if _sha256(dest) != f.sha256:
                    raise MirrorError(
                        f"{source / f.name}: changed while it was copied; run the command again"
                    )
            (staging / MANIFEST).write_text(manifest_text(files))
            where = source.resolve()
            sources = [str(where / f.name) for f in files]
            write_record(staging, origin_record(f"local directory {where}", files, sources))
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return files

    def add_checked(
        self, files: list[CheckedFile], repo: str, revision: str, origin: str
    ) -> list[ManifestFile]:
        """Copy single files in under the names given, each checked against the size and sha256 it was named by
        (an Ollama blob's digest): a file that does not match is refused and nothing is added."""
        target = self._free(repo, revision)
        staging = self._staging(repo)
        out: list[ManifestFile] = []
        try:
            for f in files:
                if not f.source.is_file():
                    raise MirrorError(f"{f.source}: no such file ({f.name} of {repo})")
                dest = staging / f.name
                shutil.copyfile(f.source, dest)
                size, sha = dest.stat().st_size, _sha256(dest)
                if sha != f.sha256 or size != f.size:
                    raise MirrorError(
                        f"{f.source}: {size} bytes with sha256 {sha}, but it was named by sha256 {f.sha256} "
                        f"and {f.size} bytes: corrupt or changed, not added (pull it again)"
                    )
                out.append(ManifestFile(f.name, size, sha))
            (staging / MANIFEST).write_text(manifest_text(out))
            write_record(staging, origin_record(origin, out, [str(f.source) for f in files]))
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return out

    async def add_url(
        self, url: str, repo: str, revision: str = DEFAULT_REVISION, token: str | None = None
    ) -> list[ManifestFile]:
        """Download the directory at `url` (its server publishes a manifest), verifying every file."""
        self._free(repo, revision)
        files = await published_manifest(url, token)
        await self.add_listed(url, files, repo, revision, token)
        return files

    async def add_listed(
        self,
        url: str,
        files: list[ManifestFile],
        repo: str,
        revision: str,
        token: str | None = None,
        upstream: tuple[str, str] | None = None,
    ) -> None:
        """Download `files` from the directory at `url`, each verified against its listed size and sha256 (a
        registry's, which publishes no manifest: the sizes and sha256 it named). `upstream`: the registry's
        repository and revision, for the origin record."""
        target = self._free(repo, revision)
        url = url if url.endswith("/") else url + "/"
        staging = self._staging(repo)
        try:
            listed = [WeightFile(name=f.name, size=f.size, sha256=f.sha256) for f in files]
            base = FetchBase(url=url, kind="origin", token=token)
            source = WeightSource(directory=url, files=listed, bases=[base])
            fetched = Path(await dirfetch.resolve_directory(source, staging, lambda _d, _t: None))
            (fetched / MANIFEST).write_text(manifest_text(files))
            record = origin_record(
                url, files, [url + quote(f.name) for f in files], *(upstream or (None, None))
            )
            write_record(fetched, record)
            os.rename(fetched, target)
        except WeightsError as exc:
            raise MirrorError(str(exc)) from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _free(self, repo: str, revision: str) -> Path:
        target = self.version_dir(repo, revision)
        if target.exists():
            raise MirrorError(
                f"the mirror already holds {repo}@{revision} ({target}); a revision names fixed bytes, "
                "so add new ones under a new revision"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def remove(self, repo: str, revision: str) -> int:
        """Delete `{repo}/{revision}` (its bytes, as a number, are returned). The directory is first renamed aside,
        so the server answers 404 for the whole version at once, never a half-deleted one."""
        target = self.version_dir(repo, revision)
        if not (target / MANIFEST).is_file():
            raise MirrorError(
                f"the mirror holds no {repo}@{revision} ({target}); `llmgw mirror list` shows what it does"
            )
        size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
        aside = Path(tempfile.mkdtemp(prefix=".removing-", dir=target.parent))
        os.rename(target, aside / "version")
        shutil.rmtree(aside)
        parent = target.parent
        while parent != self.root and parent.is_relative_to(self.root) and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
        return size

    def entries(self) -> list[MirrorEntry]:
        """Every version the mirror holds (a directory with files under ROOT/{repo}/{revision})."""
        found: list[MirrorEntry] = []
        if not self.root.is_dir():
            return found
        for manifest in sorted(self.root.glob(f"**/{MANIFEST}")):
            version = manifest.parent
            rel = version.relative_to(self.root).as_posix()
            repo, _, revision = rel.rpartition("/")
            if not repo or any(p.startswith(".") for p in rel.split("/")):
                continue
            found.append(self._entry(version, repo, revision))
        return found

    def _entry(self, version: Path, repo: str, revision: str) -> MirrorEntry:
        try:
            files = DirectoryManifest.model_validate_json((version / MANIFEST).read_bytes()).files
        except (OSError, ValueError) as exc:
            return MirrorEntry(repo, revision, 0, 0, f"unreadable manifest: {exc}")
        problem = None
        for f in files:
            path = version / f.name
            if not path.is_file() or path.stat().st_size != f.size:
                problem = f"{f.name} is missing or not {f.size} bytes"
                break
        size = sum(f.size for f in files)
        return MirrorEntry(repo, revision, len(files), size, problem, read_origin(version))


def mirror_app(root: Path, allowed: Callable[[str | None], bool]) -> web.Application:
    """The read-only HF-layout server. `allowed(token)` says whether a bearer token (None: none sent) may
    read; a refusal is 401 and names no file. Anything but GET/HEAD is 405 (aiohttp's answer)."""
    root = root.resolve()

    async def resolve(request: web.Request) -> web.StreamResponse:
        if not allowed(bearer_token(request.headers.get("Authorization"))):
            raise web.HTTPUnauthorized(text="the mirror needs Authorization: Bearer <node token>\n")
        path = _file_path(root, request.match_info["tail"])
        if path is None:
            raise web.HTTPNotFound()
        response = web.FileResponse(path, chunk_size=256 * 1024)
        response.headers.update(_hub_headers(root, path))
        return response

    app = web.Application()
    app.router.add_get("/{tail:.+}", resolve)  # GET also answers HEAD
    return app


def _hub_headers(root: Path, path: Path) -> dict[str, str]:
    """What `huggingface_hub` needs of an HF_ENDPOINT besides the bytes: `X-Repo-Commit` (the revision the
    file is filed under) and, from the manifest, the file's sha256 as `X-Linked-Etag` (HF's LFS ETag)."""
    version = next((p for p in path.parents if (p / MANIFEST).is_file() and p.is_relative_to(root)), None)
    if version is None:
        return {}
    headers = {"X-Repo-Commit": version.name}
    try:
        files = DirectoryManifest.model_validate_json((version / MANIFEST).read_bytes()).files
    except (OSError, ValueError):
        return headers
    name = path.relative_to(version).as_posix()
    sha = next((f.sha256 for f in files if f.name == name), None)
    if sha is not None:
        headers["X-Linked-Etag"] = f'"{sha}"'
    return headers


def _file_path(root: Path, tail: str) -> Path | None:
    """ROOT/{repo}/{revision}/{file} for `{repo}/resolve/{revision}/{file}`, or None (404) when the request is
    not that shape, a name breaks the per-segment rule, or nothing is there."""
    head, sep, rest = tail.partition("/resolve/")
    revision, _, name = rest.partition("/")
    if not sep or not head or not revision or not name:
        return None
    rel = f"{head}/{revision}/{name}"
    if name != MANIFEST and repo_rules.manifest_name_problem(rel) is not None:
        return None
    if name == MANIFEST and repo_rules.manifest_name_problem(f"{head}/{revision}/x") is not None:
        return None
    path = root / rel
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not real.is_relative_to(root) or not real.is_file():
        return None
    return real


async def serve(root: Path, host: str, port: int, allowed: Callable[[str | None], bool]) -> web.AppRunner:
    runner = web.AppRunner(mirror_app(root, allowed), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def run_forever(root: Path, host: str, port: int, allowed: Callable[[str | None], bool]) -> None:
    async def main() -> None:
        runner = await serve(root, host, port, allowed)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
