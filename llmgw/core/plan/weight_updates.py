"""New weights upstream for the models a catalog serves: what to ask the origin, and what its answers mean. Pure
(llmgw.adapters.source_probe.head_all sends the HEAD requests; `llmgw model updates|update` is the shell).

What is tracked is what the repo pins: a `source: {repo, revision, manifest}` pins a revision and, through the
manifest in the repo, each file's size and sha256 (without a manifest in the repo, the one the Cluster's mirror
publishes for that revision: the files its nodes were served); a single-file `source.url` pins `sha256` and/or `size_bytes`.
The origin is asked for the same files where they move on: `{origin}/{repo}/resolve/{follow}/{file}` (`follow`
is `main` unless told; the origin names the commit it is at, HF's `X-Repo-Commit`, and each file's sha256,
`X-Linked-Etag`) or the URL itself. The origin of a `repo` source is the one its version recorded: the registry
the mirror's `llmgw-origin.json` for the pinned revision names (`recorded_origin`), else the Cluster's
`mirror.origin`, and each answer says which it asked and why. A model has an update when a file's bytes differ there; a new
commit whose files are the same is no update. Commits compare shortened (the repo may pin `a09a354` of a
40-digit commit). Never a silent pass: what cannot be asked or answered is `not checked`, with why.

An update is a commit to the repo (`llmgw model update MODEL --write` edits the pins: `revision` and the manifest
file, or `sha256`/`size_bytes`); the plan shows it as any change of source, rolled one replica at a time, and
going back is reverting that commit, which restores the old pins and so the old checksums on every node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, unquote, urlsplit

from llmgw_agent.origins import OriginRecord

from llmgw.core.plan.source_check import Answer
from llmgw.core.weights.fetch_plan import DEFAULT_REVISION, hf_base
from llmgw.core.weights.manifest import ManifestFile

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog, ModelEntry

__all__ = [
    "FOLLOW",
    "AskedOrigin",
    "Published",
    "Recorded",
    "Tracked",
    "TrackedFile",
    "Update",
    "judge_update",
    "mirror_manifests_to_read",
    "mirror_versions",
    "recorded_origin",
    "same_commit",
    "tracked",
]

FOLLOW = "main"
UpdateState = Literal["current", "changed", "not checked"]


@dataclass(frozen=True, slots=True)
class TrackedFile:
    name: str
    url: str  # where the origin has it now
    size: int | None  # what the repo pins (None: not pinned)
    sha256: str | None


@dataclass(frozen=True, slots=True)
class AskedOrigin:
    """The registry a `repo` source is asked at: its root URL, the repository's name there, and which origin
    this is in words (the one its version recorded, or the configured one and why)."""

    base: str
    repo: str
    words: str


@dataclass(frozen=True, slots=True)
class Tracked:
    model: str
    source: str  # in words: org/name@rev, or the URL
    revision: str | None  # the pinned revision of a `repo` source; None for a URL
    files: tuple[TrackedFile, ...] = ()
    unchecked: str | None = None  # why it cannot be asked at all
    origin: AskedOrigin | None = None  # a `repo` source's registry; None: a URL (asked at itself)


@dataclass(frozen=True, slots=True)
class Update:
    model: str
    source: str
    state: UpdateState
    detail: str
    revision: str | None = None  # the origin's commit (a `repo` source that changed); None: not said or a URL
    files: tuple[ManifestFile, ...] = ()  # every file as the origin has it now (when changed)
    changed: tuple[str, ...] = ()  # the names whose bytes differ
    # False: nothing could be asked at all (no source, a node path, no origin, nothing pinned)
    asked: bool = True
    origin: str | None = None  # which origin was asked, and why that one (a `repo` source)
    # A changed `repo` source: the origin's directory of the new commit (HF layout), where its files are fetched,
    # and the repository's name there.
    fetch_from: str | None = None
    upstream: str | None = None


Published = Mapping[
    str, "tuple[ManifestFile, ...] | str"
]  # model -> the mirror's manifest, or why it was not read
# model -> the mirror's origin record for its pinned revision; None: the mirror holds none; str: why not read
Recorded = Mapping[str, "OriginRecord | str | None"]


def mirror_versions(catalog: Catalog) -> dict[str, str]:
    """Model -> the mirror's directory of its pinned revision (HF layout), for each `repo` source when the Cluster
    names a mirror and an origin: where the version's origin record (llmgw-origin.json) is read."""
    mirror = catalog.cluster.mirror
    out: dict[str, str] = {}
    for name, entry in sorted(catalog.models.items()):
        source = entry.spec.source
        if mirror.url and mirror.origin != "none" and source is not None and source.repo is not None:
            out[name] = hf_base(mirror.url, source.repo, source.revision or DEFAULT_REVISION)
    return out


def recorded_origin(
    configured: str, repo: str, revision: str, record: OriginRecord | str | None
) -> AskedOrigin:
    """The registry to ask for `repo`: the one the mirror's record for `repo@revision` names (the URL `mirror
    add` fetched it from, `{base}/{repository}/resolve/{revision}/`), else `configured`, saying why."""
    version = f"{repo}@{revision}"
    if record is None:
        why = f"the mirror records no origin for {version}"
    elif isinstance(record, str):
        why = f"the mirror's origin record for {version} could not be read: {record}"
    else:
        found = _registry(record, repo)
        if not isinstance(found, str):
            base, upstream = found
            return AskedOrigin(base, upstream, f"{base} (recorded by the mirror for {version})")
        why = found
    return AskedOrigin(configured, repo, f"{configured} (the Cluster's mirror.origin: {why})")


def _registry(record: OriginRecord, repo: str) -> tuple[str, str] | str:
    """(root URL, repository) of a record's registry URL, or why the record names none."""
    url = record.origin
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"the mirror's record names {url!r}, not a registry"
    head, sep, _ = unquote(parts.path).partition("/resolve/")
    upstream = record.repository or repo
    if not sep or not head.endswith("/" + upstream):
        return f"the mirror's record names {url}, not a registry's {upstream}/resolve/REVISION/"
    root = head.removesuffix("/" + upstream)
    return f"{parts.scheme}://{parts.netloc}{root}", upstream


def mirror_manifests_to_read(catalog: Catalog) -> dict[str, str]:
    """Model -> the mirror URL of the manifest it publishes, for each `repo` source whose repo holds no manifest:
    the files its nodes were served are the ones the mirror lists for the pinned revision."""
    mirror = catalog.cluster.mirror.url
    out: dict[str, str] = {}
    for name, entry in sorted(catalog.models.items()):
        source = entry.spec.source
        if mirror and source is not None and source.repo is not None and entry.manifest is None:
            out[name] = hf_base(mirror, source.repo, source.revision or DEFAULT_REVISION)
    return out


def tracked(
    catalog: Catalog,
    follow: str = FOLLOW,
    published: Published | None = None,
    recorded: Recorded | None = None,
) -> list[Tracked]:
    """What to ask about each model of `catalog` that has a source, by name. `published`: the manifests read from
    the mirror for the models `mirror_manifests_to_read` named; `recorded`: the origin records read from it for
    the models `mirror_versions` named."""
    origin = catalog.cluster.mirror.origin
    out: list[Tracked] = []
    for name, entry in sorted(catalog.models.items()):
        item = _tracked(name, entry, origin, follow, (published or {}).get(name))
        source = entry.spec.source
        if item.files and item.revision is not None and source is not None and source.repo is not None:
            asked = recorded_origin(origin, source.repo, item.revision, (recorded or {}).get(name))
            base = hf_base(asked.base, asked.repo, follow)
            files = tuple(replace(f, url=base + quote(f.name)) for f in item.files)
            item = replace(item, files=files, origin=asked)
        out.append(item)
    return out


def _tracked(
    name: str, entry: ModelEntry, origin: str, follow: str, published: tuple[ManifestFile, ...] | str | None
) -> Tracked:
    source = entry.spec.source
    if source is None or source.path is not None:
        where = "no source" if source is None else "a path on the node"
        return Tracked(name, where, None, unchecked=f"{where}: nothing upstream to ask")
    if source.repo is not None:
        revision = source.revision or DEFAULT_REVISION
        words = f"{source.repo}@{revision}"
        if origin == "none":
            return Tracked(
                name, words, revision, unchecked="the Cluster's mirror.origin is none: no origin to ask"
            )
        pinned = entry.manifest if entry.manifest is not None else published
        if pinned is None or isinstance(pinned, str):
            why = "no manifest in the repo pins its files (spec.source.manifest, `llmgw model manifest`)"
            why += "" if pinned is None else f", and the mirror's could not be read: {pinned}"
            return Tracked(name, words, revision, unchecked=why)
        base = hf_base(origin, source.repo, follow)
        files = tuple(TrackedFile(f.name, base + quote(f.name), f.size, f.sha256) for f in pinned)
        return Tracked(name, words, revision, files)
    assert source.url is not None
    if source.directory:
        return Tracked(
            name, source.url, None, unchecked="a directory URL: its revision is not named, only its files"
        )
    if source.sha256 is None and source.size_bytes is None:
        return Tracked(
            name, source.url, None, unchecked="the repo pins neither sha256 nor size_bytes to compare"
        )
    file_name = unquote(urlsplit(source.url).path.rsplit("/", 1)[-1]) or source.url
    return Tracked(
        name, source.url, None, (TrackedFile(file_name, source.url, source.size_bytes, source.sha256),)
    )


def same_commit(a: str, b: str) -> bool:
    """Two revisions name the same commit when one is the other shortened (at least 7 digits)."""
    short = min(len(a), len(b))
    return a == b or (short >= 7 and a[:short].lower() == b[:short].lower())


def judge_update(item: Tracked, answers: Mapping[str, Answer]) -> Update:
    """The origin's answers for `item`'s files -> current, changed (with the new files) or not checked; for a
    `repo` source, which origin was asked and, when it changed, where its new commit's files are."""
    found = _judge(item, answers)
    if item.origin is None:
        return found
    at = None
    if found.state == "changed" and found.revision is not None:
        at = hf_base(item.origin.base, item.origin.repo, found.revision)
    return replace(found, origin=item.origin.words, fetch_from=at, upstream=item.origin.repo)


def _judge(item: Tracked, answers: Mapping[str, Answer]) -> Update:
    if item.unchecked is not None:
        return Update(item.model, item.source, "not checked", item.unchecked, asked=False)
    now: list[ManifestFile] = []
    changed: list[str] = []
    commits: set[str] = set()
    for f in item.files:
        answer = answers.get(f.url)
        if answer is None or answer.status is None:
            why = "was not asked" if answer is None else f"no answer ({answer.error or 'unknown error'})"
            return Update(item.model, item.source, "not checked", f"{f.url}: {why}")
        if answer.status != 200:
            return Update(item.model, item.source, "not checked", f"{f.url} answered HTTP {answer.status}")
        if answer.sha256 is None or answer.size is None:
            why = f"{f.url} names no sha256 and size (X-Linked-Etag/ETag, Content-Length): nothing to compare"
            return Update(item.model, item.source, "not checked", why)
        if answer.commit:
            commits.add(answer.commit)
        now.append(ManifestFile(f.name, answer.size, answer.sha256))
        if (f.sha256 is not None and f.sha256.lower() != answer.sha256) or (
            f.size not in (None, answer.size)
        ):
            changed.append(f.name)
    if len(commits) > 1:
        why = f"the origin named several commits for one model's files ({', '.join(sorted(commits))}): asked mid-push"
        return Update(item.model, item.source, "not checked", why)
    commit = next(iter(commits), None)
    if not changed:
        at = f" (the origin is at {commit})" if commit else ""
        return Update(
            item.model, item.source, "current", f"{len(now)} file(s) as the repo pins them{at}", commit
        )
    if item.revision is not None and commit is None:
        why = "its files changed at the origin, which names no commit (X-Repo-Commit) to pin: give --revision"
        return Update(item.model, item.source, "not checked", why, None, tuple(now), tuple(changed))
    if item.revision is not None and commit is not None and same_commit(commit, item.revision):
        why = f"its files differ at the origin's {commit}, the very revision the repo pins: the origin rewrote it"
        return Update(item.model, item.source, "changed", why, commit, tuple(now), tuple(changed))
    to = f" at {commit}" if commit else ""
    detail = f"{', '.join(changed)} changed upstream{to}"
    return Update(item.model, item.source, "changed", detail, commit, tuple(now), tuple(changed))
