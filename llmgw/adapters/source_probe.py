"""The I/O half of `llmgw plan`'s source check (llmgw.core.plan.source_check decides what to ask and what the
answers mean): HEAD requests, a bounded number at once with a short timeout, and the published manifest of a
directory the repo holds none for.

Every connection goes through the agent's checked session (llmgw_agent.weights: no link-local or metadata
address, after redirects and DNS too), so a cluster repo cannot make CI's plan step reach what a node would be
refused. Redirects, the manifest read's included, are followed by hand (`weights.following`: each hop checked)
so the HF headers of the first hop (`X-Linked-Size`, `X-Linked-Etag`: the Hub answers a file with a redirect to
its CDN) are kept. A token is sent only to the mirror, only when the
operator gave one, and never to another host after a redirect; the origin's token is a secret reference the
plan never resolves, so a gated origin reads as "not checked".
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import aiohttp
from aiohttp.abc import AbstractResolver
from llmgw_agent import repo_rules
from llmgw_agent.origins import OriginRecord
from llmgw_agent.protocol import DirectoryManifest
from llmgw_agent.weights import WeightsError, checked_session, following
from pydantic import ValidationError

from llmgw.adapters.mirror import MirrorError, published_manifest, published_origin
from llmgw.core.plan.source_check import (
    Answer,
    SourceToCheck,
    SourceVerdict,
    judge,
    not_checked,
    probes_for,
)
from llmgw.core.plan.weight_updates import (
    FOLLOW,
    Update,
    judge_update,
    mirror_manifests_to_read,
    mirror_versions,
    tracked,
)
from llmgw.core.weights.manifest import ManifestFile

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog

__all__ = ["PARALLEL", "TIMEOUT_S", "ask_updates", "check_sources", "head_all"]

PARALLEL = 8  # HEAD requests in flight at once, over every source
TIMEOUT_S = 10.0  # per request: a plan waits seconds for a server, not minutes
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_SHA256 = re.compile(r'^(?:W/)?"?([0-9a-fA-F]{64})"?$')


async def check_sources(
    items: Sequence[SourceToCheck],
    *,
    mirror_url: str | None = None,
    mirror_token: str | None = None,
    parallel: int = PARALLEL,
    timeout_s: float = TIMEOUT_S,
    resolver: AbstractResolver | None = None,
) -> list[SourceVerdict]:
    """A verdict for every item, in order. `mirror_token` goes to URLs under `mirror_url` only."""
    if not items:
        return []
    asker = _Asker(parallel, timeout_s, mirror_url, mirror_token)
    async with checked_session(resolver) as session:
        asker.session = session
        return list(await asyncio.gather(*(asker.verdict(item) for item in items)))


async def head_all(
    urls: Sequence[str], *, parallel: int = PARALLEL, timeout_s: float = TIMEOUT_S
) -> dict[str, Answer]:
    """What each URL answers to HEAD (size, sha256 and commit where the server names them), asked as the plan's
    check asks: through the checked session, a bounded number at once. No token is sent."""
    asker = _Asker(parallel, timeout_s, None, None)
    async with checked_session() as session:
        asker.session = session

        async def one(url: str) -> tuple[str, Answer]:
            async with asker.gate:
                return url, await asker._head(url)

        return dict(await asyncio.gather(*(one(u) for u in dict.fromkeys(urls))))


async def ask_updates(catalog: Catalog, follow: str = FOLLOW, model: str | None = None) -> list[Update]:
    """Whether the files each model of `catalog` pins (or only `model`) changed at the origin: the manifests the
    mirror publishes for models whose repo holds none and the origin it recorded for each pinned version, then
    HEAD of every tracked file (llmgw.core.plan.weight_updates says what to ask and what the answers mean). `llmgw model updates` and the controller's
    periodic check both ask this way."""
    to_read = {m: url for m, url in mirror_manifests_to_read(catalog).items() if model in (None, m)}
    published: dict[str, tuple[ManifestFile, ...] | str] = {}
    for name, url in to_read.items():
        try:
            published[name] = tuple(await published_manifest(url))
        except MirrorError as exc:
            published[name] = str(exc)
    recorded = await _recorded_origins(catalog, model)
    items = [t for t in tracked(catalog, follow, published, recorded) if model in (None, t.model)]
    answers = await head_all([f.url for t in items for f in t.files])
    return [judge_update(t, answers) for t in items]


async def _recorded_origins(catalog: Catalog, model: str | None) -> dict[str, OriginRecord | str | None]:
    """Model -> the origin record the mirror publishes for its pinned revision (None: none; str: why not read),
    each version read once however many models pin it."""
    versions = {m: url for m, url in mirror_versions(catalog).items() if model in (None, m)}

    async def one(url: str) -> tuple[str, OriginRecord | str | None]:
        try:
            return url, await published_origin(url)
        except MirrorError as exc:
            return url, str(exc)

    found = dict(await asyncio.gather(*(one(u) for u in set(versions.values()))))
    return {m: found[url] for m, url in versions.items()}


class _Asker:
    def __init__(self, parallel: int, timeout_s: float, mirror_url: str | None, token: str | None) -> None:
        self.gate = asyncio.Semaphore(max(1, parallel))
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.mirror = mirror_url.rstrip("/") + "/" if mirror_url else None
        self.token = token
        self.session: aiohttp.ClientSession | None = None

    def _auth(self, url: str) -> dict[str, str]:
        if self.token and self.mirror and url.startswith(self.mirror):
            return {"Authorization": f"Bearer {self.token}"}
        return {}

    async def verdict(self, item: SourceToCheck) -> SourceVerdict:
        if item.unchecked is not None:
            return not_checked(item, item.unchecked)
        if item.read_manifest:
            files = await self._published_manifest(item)
            if isinstance(files, SourceVerdict):
                return files
            item = replace(item, probes=probes_for(files, item.bases), read_manifest=False)
        answers: dict[str, Answer] = {}

        async def ask(urls: tuple[str, ...]) -> None:
            for url in urls:  # the next base only after a 404, as a node does
                async with self.gate:
                    answers[url] = await self._head(url)
                if answers[url].status != 404:
                    return

        await asyncio.gather(*(ask(p.urls) for p in item.probes))
        return judge(item, answers)

    async def _head(self, url: str) -> Answer:
        assert self.session is not None
        size: int | None = None
        sha: str | None = None
        commit: str | None = None

        def linked(
            resp: aiohttp.ClientResponse,
        ) -> None:  # the Hub's first hop names the file's size, hash and commit
            nonlocal size, sha, commit
            size = size if size is not None else _int(resp.headers.get("X-Linked-Size"))
            sha = sha or _sha256(resp.headers.get("X-Linked-Etag"))
            commit = commit or resp.headers.get("X-Repo-Commit")

        try:
            async with following(
                self.session,
                url,
                method="HEAD",
                auth=self._auth(url),
                client_timeout=self.timeout,
                each_answer=linked,
            ) as resp:
                if 200 <= resp.status < 300:
                    size = size if size is not None else resp.content_length
                    sha = sha or _sha256(resp.headers.get("ETag"))
                return Answer(resp.status, size, sha, commit=commit)
        except WeightsError as exc:
            return Answer(None, error=str(exc))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return Answer(None, error=str(exc) or type(exc).__name__)

    async def _published_manifest(self, item: SourceToCheck) -> list[ManifestFile] | SourceVerdict:
        """The manifest the first base publishes (as the node reads it), or the verdict when none can be read."""
        assert self.session is not None
        missing: list[str] = []
        for base in item.bases:
            url = base + repo_rules.MANIFEST_FILE
            try:
                async with (
                    self.gate,
                    following(self.session, url, auth=self._auth(url), client_timeout=self.timeout) as resp,
                ):
                    if resp.status == 404:
                        missing.append(url)
                        continue
                    if resp.status != 200:
                        return not_checked(item, f"{url} answered HTTP {resp.status}")
                    body = await resp.content.read(MAX_MANIFEST_BYTES + 1)
            except WeightsError as exc:
                return not_checked(item, str(exc))
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                return not_checked(item, f"{url}: no answer ({exc or type(exc).__name__})")
            try:
                files = DirectoryManifest.model_validate_json(body[:MAX_MANIFEST_BYTES]).files
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                return _error(
                    item, f"{url}: not a manifest ({where}: {first['msg']}); a node would refuse it"
                )
            return [ManifestFile(f.name, f.size, f.sha256) for f in files]
        return _error(
            item,
            f"no {repo_rules.MANIFEST_FILE} at {' nor at '.join(missing)} (HTTP 404): a node could not fetch it; "
            "write one with `llmgw model manifest` and name it in spec.source.manifest",
        )


def _error(item: SourceToCheck, words: str) -> SourceVerdict:
    return SourceVerdict(item.model, item.source, "error", words, item.where, (words,))


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _sha256(etag: str | None) -> str | None:
    """An ETag that is a sha256 (HF's LFS files, the llmgw mirror's X-Linked-Etag); None for any other."""
    found = _SHA256.match(etag.strip()) if etag else None
    return found.group(1).lower() if found else None
