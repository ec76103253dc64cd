"""What a node is told about a Model's weights: the one rule for where each file is fetched from. Pure.

A `repo` source is fetched from the Cluster's mirror first and from the origin only when the mirror answers 404;
an air-gapped node (or `mirror.origin: none`) gets no origin at all. A `url` ending in `/` names its own server,
which is its only base. The origin's token (resolved by the caller) rides on the origin base only: the agent
presents its own node token to the mirror.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from llmgw_agent.protocol import FetchBase, WeightFile, WeightSource

from llmgw.core.config.models import MirrorSettings, Source
from llmgw.core.weights.manifest import ManifestFile

__all__ = ["DEFAULT_REVISION", "directory_key", "hf_base", "weight_source"]

DEFAULT_REVISION = "main"


def hf_base(base_url: str, repo: str, revision: str) -> str:
    """The HF layout's directory of one revision: {base}/{repo}/resolve/{revision}/ (files are appended)."""
    return f"{base_url.rstrip('/')}/{quote(repo)}/resolve/{quote(revision, safe='')}/"


def directory_key(source: Source) -> str:
    """The name a node caches a directory under: `repo@revision`, or the URL prefix."""
    if source.repo is not None:
        return f"{source.repo}@{source.revision or DEFAULT_REVISION}"
    assert source.url is not None
    return source.url


def weight_source(
    source: Source,
    mirror: MirrorSettings,
    *,
    airgapped: bool,
    manifest: Sequence[ManifestFile] | None,
    token: str | None,
) -> WeightSource:
    """The WeightSource a node's agent is sent. Raises ValueError when a `repo` source has nowhere to come
    from on this node (no mirror, and no origin for it)."""
    if not source.directory:
        return WeightSource(path=source.path, url=source.url, sha256=source.sha256, size=source.size_bytes)
    files = (
        None
        if manifest is None
        else [WeightFile(name=f.name, size=f.size, sha256=f.sha256) for f in manifest]
    )
    bases: list[FetchBase] = []
    if source.repo is None:
        assert source.url is not None
        bases.append(FetchBase(url=source.url, kind="origin", token=token))
    else:
        revision = source.revision or DEFAULT_REVISION
        if mirror.url:
            bases.append(FetchBase(url=hf_base(mirror.url, source.repo, revision), kind="mirror"))
        if mirror.origin != "none" and not airgapped:
            bases.append(
                FetchBase(url=hf_base(mirror.origin, source.repo, revision), kind="origin", token=token)
            )
        if not bases:
            where = "this node is air-gapped" if airgapped else "the Cluster's mirror.origin is none"
            raise ValueError(f"{source.repo}: no mirror is declared and {where}: nowhere to fetch it from")
    pinned = None if source.repo is None else source.revision or DEFAULT_REVISION
    return WeightSource(
        directory=directory_key(source), files=files, bases=bases, repo=source.repo, revision=pinned
    )
