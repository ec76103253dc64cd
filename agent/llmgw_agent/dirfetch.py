"""Directory sources: every file a manifest lists, fetched into a staging directory and published by one rename.

A replica never starts on half a model: files are fetched (a bounded number at once, each resumable with Range
into `NAME.part`, each verified against the manifest's size and sha256) into `<cache>/<key>/staging/`, and only
when all are there is `staging` renamed to `model`, which is what the engine is given. A corrupt file publishes
nothing and the error names it. An interrupted fetch keeps the files already verified and resumes the rest.
Beside `model/`, `<cache>/<key>/llmgw-origin.json` notes each file as it is verified: the URL it came from, its
sha256 and size, when (llmgw_agent.origins, the record the mirror keeps too).

Each file is tried at the bases in order (the mirror, then the origin) and the next base only when one answers
404. The agent's own node token goes to the mirror; the origin's token (from the controller) to the origin's host
only, never after a redirect to another host, and neither appears in a message: errors name URLs, which never
hold a token. Every connection goes through weights.checked_session (the SSRF rules of single files).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aiohttp
from aiohttp.abc import AbstractResolver
from pydantic import ValidationError

from llmgw_agent import repo_rules
from llmgw_agent.origins import FileOrigin, OriginRecord, read_record, write_record
from llmgw_agent.protocol import (
    DirectoryManifest,
    FetchBase,
    WeightFile,
    WeightSource,
    manifest_digest,
)
from llmgw_agent.weights import (
    NotAtSource,
    Progress,
    WeightsError,
    _download,
    check_url,
    checked_session,
    following,
)

log = logging.getLogger(__name__)

DEFAULT_PARALLEL = 4
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
# The headers a mirror request to this URL carries (the agent's hub token, to its controller's mirror only).
Headers = Callable[[str], dict[str, str]]
# One fetch per directory at a time on this agent: two replicas of one model share the staging directory. Held
# weakly: a lock lives while a fetch of its directory holds it (or waits for it), so the table holds the
# directories being fetched now, never every directory this agent has fetched.
_LOCKS: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()


DIRECTORY_PREFIX = "dir-"  # a directory source's root in the cache: dir-<24 hex>/{staging,model}
PUBLISHED = "model"


def directory_root(cache_dir: Path, key: str, files: list[WeightFile]) -> Path:
    """Named by the source and its manifest: new bytes under an old name (a moved `main`, a URL whose files
    changed) are a new directory, never a published one quietly disagreeing with what was asked for."""
    digest = hashlib.sha256(key.encode())
    for f in sorted(files, key=lambda f: f.name):
        digest.update(f"\0{f.name}\0{f.size}\0{f.sha256}".encode())
    return cache_dir / (DIRECTORY_PREFIX + digest.hexdigest()[:24])


def check_names(files: list[WeightFile], where: str) -> None:
    seen: set[str] = set()
    for f in files:
        problem = repo_rules.manifest_name_problem(f.name)
        if problem is not None:
            raise WeightsError(f"{where}: file {f.name[:200]!r} refused: {problem}")
        if f.name in seen:
            raise WeightsError(f"{where}: file {f.name!r} is listed twice")
        seen.add(f.name)


def no_headers(url: str) -> dict[str, str]:
    return {}


def _auth(base: FetchBase, mirror_headers: Headers) -> dict[str, str]:
    if base.kind == "mirror":
        return mirror_headers(base.url)
    return {"Authorization": f"Bearer {base.token}"} if base.token else {}


def _file_url(base: FetchBase, name: str) -> str:
    return base.url + quote(name)


@dataclass(frozen=True)
class Published:
    """A published directory: where it lies and the manifest it was verified against."""

    path: str
    files: list[WeightFile]

    @property
    def digest(self) -> str:
        return manifest_digest((f.name, f.size, f.sha256) for f in self.files)


async def resolve_directory(
    source: WeightSource,
    cache_dir: Path,
    progress: Progress,
    *,
    parallel: int = DEFAULT_PARALLEL,
    mirror_headers: Headers = no_headers,
    resolver: AbstractResolver | None = None,
) -> str:
    """The published directory's path, fetching whatever is missing first."""
    published = await fetch_directory(
        source, cache_dir, progress, parallel=parallel, mirror_headers=mirror_headers, resolver=resolver
    )
    return published.path


async def fetch_directory(
    source: WeightSource,
    cache_dir: Path,
    progress: Progress,
    *,
    parallel: int = DEFAULT_PARALLEL,
    mirror_headers: Headers = no_headers,
    resolver: AbstractResolver | None = None,
) -> Published:
    """The published directory and its manifest (read from the bases when the source carries none)."""
    key = source.directory
    if not key or not source.bases:
        raise WeightsError("a directory source needs its name and at least one place to fetch it from")
    for base in source.bases:
        check_url(base.url)
    lock = _LOCKS.setdefault(key, asyncio.Lock())
    async with lock, checked_session(resolver) as session:
        files = source.files or await read_manifest(session, source, mirror_headers)
        check_names(files, f"manifest of {key}")
        root = directory_root(cache_dir, key, files)
        final, staging = root / PUBLISHED, root / "staging"
        total = sum(f.size for f in files)
        if final.is_dir():
            await asyncio.to_thread(_check_published, final, files, key)
            progress(total, total)
            return Published(str(final), files)
        staging.mkdir(parents=True, exist_ok=True)
        notes = _OriginNotes(root, source)
        fetcher = _Fetcher(session, source.bases, staging, progress, total, mirror_headers, notes)
        semaphore = asyncio.Semaphore(max(1, parallel))

        async def one(f: WeightFile) -> None:
            async with semaphore:
                await fetcher.fetch(f)

        try:
            async with asyncio.TaskGroup() as group:
                for f in files:
                    group.create_task(one(f))
        except ExceptionGroup as group_error:  # the first failure cancelled the rest; it is the one to say
            raise group_error.exceptions[0] from None
        os.rename(staging, final)  # the one step that makes the model visible
        log.info("published %s: %d files, %d bytes", key, len(files), total)
    return Published(str(final), files)


def _check_published(final: Path, files: list[WeightFile], key: str) -> None:
    # Published only after every file was verified; this catches a hand-edited cache, not a half fetch.
    for f in files:
        path = final / f.name
        if not path.is_file() or path.stat().st_size != f.size:
            raise WeightsError(
                f"cached directory of {key} ({final}): {f.name} is missing or its size changed; "
                "remove the directory to fetch it again"
            )


class _OriginNotes:
    """The directory's llmgw-origin.json (llmgw_agent.origins), beside `model/` in its root: each file noted as it
    is verified, so an interrupted fetch keeps the notes of the files it kept."""

    def __init__(self, root: Path, source: WeightSource) -> None:
        self.root = root
        earlier = read_record(root)
        self.files = {f.name: f for f in earlier.files} if earlier is not None else {}
        self.record = OriginRecord(
            origin="; ".join(f"{b.kind} {b.url}" for b in source.bases),
            repository=source.repo,
            revision=source.revision,
        )

    def fetched(self, note: FileOrigin) -> None:
        self.files[note.name] = note
        self.record.files = sorted(self.files.values(), key=lambda f: f.name)
        write_record(self.root, self.record)


class _Fetcher:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        bases: list[FetchBase],
        staging: Path,
        progress: Progress,
        total: int,
        mirror_headers: Headers,
        origins: _OriginNotes,
    ) -> None:
        self.session, self.bases, self.staging = session, bases, staging
        self.report, self.total, self.mirror_headers = progress, total, mirror_headers
        self.origins = origins
        self.done: dict[str, int] = {}

    def _progress(self, name: str) -> Progress:
        def update(done: int, _total: int | None) -> None:
            self.done[name] = done
            self.report(sum(self.done.values()), self.total)

        return update

    async def fetch(self, f: WeightFile) -> None:
        target = self.staging / f.name
        if not target.resolve().is_relative_to(self.staging.resolve()):
            raise WeightsError(f"file {f.name!r} would land outside the model directory")
        update = self._progress(f.name)
        if target.is_file() and target.stat().st_size == f.size:
            update(f.size, f.size)  # verified before it was renamed from .part on an earlier run
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        spec = WeightSource(sha256=f.sha256, size=f.size)
        for base in self.bases:
            url = _file_url(base, f.name)
            try:
                await _download(
                    self.session, url, target, spec, update, f.size, _auth(base, self.mirror_headers)
                )
                update(f.size, f.size)  # a resume that found the .part complete (416) reported nothing
                self.origins.fetched(FileOrigin.now(f.name, url, f.sha256, f.size))
                return
            except NotAtSource:
                log.info("%s: not at the %s (404); trying the next source", f.name, base.kind)
            except WeightsError as exc:
                raise WeightsError(f"model file {f.name}: {exc}") from exc
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise WeightsError(
                    f"model file {f.name}: fetching {url}: {exc or type(exc).__name__}"
                ) from exc
        kinds = " or the ".join(b.kind for b in self.bases)
        raise WeightsError(f"model file {f.name}: not at the {kinds} (HTTP 404)")


async def read_manifest(
    session: aiohttp.ClientSession, source: WeightSource, mirror_headers: Headers
) -> list[WeightFile]:
    """The manifest the first base that has one publishes (DIR/llmgw-manifest.json)."""
    for base in source.bases:
        url = base.url + repo_rules.MANIFEST_FILE
        body = await _get_small(session, url, _auth(base, mirror_headers))
        if body is None:
            continue
        try:
            return DirectoryManifest.model_validate_json(body).files
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            looks = (
                " (it looks like HTML: a directory listing, not a manifest)"
                if body.lstrip()[:1] == b"<"
                else ""
            )
            raise WeightsError(f"manifest {url}: {where}: {first['msg']}{looks}") from exc
    raise WeightsError(
        f"{source.directory}: no {repo_rules.MANIFEST_FILE} at the "
        + " or the ".join(b.kind for b in source.bases)
        + " (HTTP 404); write one with `llmgw model manifest` and name it in spec.source.manifest"
    )


async def _get_small(session: aiohttp.ClientSession, url: str, auth: dict[str, str]) -> bytes | None:
    """The body at `url` (None on 404), at most MAX_MANIFEST_BYTES; auth only to `url`'s own host."""
    try:
        async with following(session, url, auth=auth) as resp:
            if resp.status == 404:
                return None
            if resp.status != 200:
                raise WeightsError(f"manifest {url}: HTTP {resp.status}")
            body = await resp.content.read(MAX_MANIFEST_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise WeightsError(f"manifest {url}: {exc or type(exc).__name__}") from exc
    if len(body) > MAX_MANIFEST_BYTES:
        raise WeightsError(f"manifest {url}: larger than {MAX_MANIFEST_BYTES} bytes")
    return body
