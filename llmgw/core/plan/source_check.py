"""`llmgw plan` checks that each new or changed weights source exists and matches the repo. Pure.

What to ask (`to_check`) and what the answers mean (`judge`) are decided here; llmgw.adapters.source_probe
sends the HEAD requests. A file source is one HEAD (its size, and its sha256 where the server names one: the
HF `X-Linked-Etag` a mirror or the Hub sends); a directory source is one HEAD per manifest file, at the mirror
first and at the origin only when the mirror answers 404, as a node fetches it. A directory whose manifest is
not in the repo is checked against the manifest its server publishes.

Three outcomes, never a silent pass: `checked`; `not checked` with the reason (offline, no answer, a server
that wants a token the plan does not send, a path that lies on a node); `error` — a missing file or a size or
digest that differs from the repo's — which fails the plan, naming the model, the source's place in the repo
and the URL. Only sources that are new or changed against the applied revision are checked: an unchanged one
was checked when it was planned, and is being fetched or served already.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, unquote, urlsplit

from llmgw.core.config.models import MirrorSettings, ModelSpec, Source
from llmgw.core.weights.fetch_plan import DEFAULT_REVISION, directory_key, hf_base
from llmgw.core.weights.manifest import ManifestFile

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog, ModelEntry

__all__ = [
    "Answer",
    "Probe",
    "SourceToCheck",
    "SourceVerdict",
    "gguf_headers_to_read",
    "judge",
    "not_checked",
    "probes_for",
    "to_check",
]

VerdictState = Literal["checked", "not checked", "error"]


@dataclass(frozen=True, slots=True)
class Probe:
    """One file to ask about: its URLs in order (the next asked only when one answers 404), and what the repo
    says of it (None: nothing to compare)."""

    name: str
    urls: tuple[str, ...]
    size: int | None
    sha256: str | None


@dataclass(frozen=True, slots=True)
class SourceToCheck:
    model: str
    source: str  # the source in words: `org/name@rev`, a URL, a path
    where: str  # `file:line:col` of spec.source in the repo
    bases: tuple[str, ...] = ()  # a directory's bases, in the order a node tries them
    probes: tuple[Probe, ...] = ()
    # A directory without a repo manifest: read the one the first base publishes, then probe its files.
    read_manifest: bool = False
    unchecked: str | None = None  # why this source cannot be checked from here at all


@dataclass(frozen=True, slots=True)
class Answer:
    """What one URL said to HEAD: the status, the size and sha256 it named (None: not named), or no answer."""

    status: int | None
    size: int | None = None
    sha256: str | None = None
    error: str | None = None  # no answer: why (connection refused, timed out, name not resolved)
    commit: str | None = (
        None  # the revision the server says the file is at (HF's X-Repo-Commit); None: not said
    )


@dataclass(frozen=True, slots=True)
class SourceVerdict:
    model: str
    source: str
    state: VerdictState
    detail: str  # checked: what was seen; not checked: why; error: the first problem
    where: str = ""
    problems: tuple[str, ...] = ()  # every error, each naming the file and the URL


# ---------------------------------------------------------------------------------------------- what to ask


def to_check(
    catalog: Catalog,
    where: Mapping[str, str],
    previous: Mapping[str, ModelSpec] | None,
    documents: Mapping[str, Mapping[str, Any]] | None,
) -> list[SourceToCheck]:
    """The sources of `catalog` that are new or changed against the applied models (`previous`, None: not
    known, so every one is) and their manifests (from the applied `documents`). `where` maps a model to its
    source's `file:line:col`."""
    out: list[SourceToCheck] = []
    for name, entry in sorted(catalog.models.items()):
        source = entry.spec.source
        if source is None or not _changed(name, entry, previous, documents):
            continue
        out.append(_item(name, entry, source, catalog.cluster.mirror, where.get(name, "")))
    return out


def _changed(
    name: str,
    entry: ModelEntry,
    previous: Mapping[str, ModelSpec] | None,
    documents: Mapping[str, Mapping[str, Any]] | None,
) -> bool:
    if previous is None or name not in previous or previous[name].source != entry.spec.source:
        return True
    if entry.manifest_digest is None:
        return False
    applied = (documents or {}).get(f"Model/{name}")
    return applied is None or applied.get("manifest_sha256") != entry.manifest_digest


def _item(name: str, entry: ModelEntry, source: Source, mirror: MirrorSettings, where: str) -> SourceToCheck:
    if source.path is not None:
        words = "a path on the node: its agent checks it when a replica starts there"
        return SourceToCheck(name, source.path, where, unchecked=words)
    if not source.directory:
        assert source.url is not None
        probe = Probe(_url_name(source.url), (source.url,), source.size_bytes, source.sha256)
        return SourceToCheck(name, source.url, where, probes=(probe,))
    bases = _bases(source, mirror)
    label = directory_key(source)
    if not bases:
        return SourceToCheck(name, label, where, unchecked="no mirror and no origin to ask")
    if entry.manifest is None:
        return SourceToCheck(name, label, where, bases, read_manifest=True)
    return SourceToCheck(name, label, where, bases, probes_for(entry.manifest, bases))


def _bases(source: Source, mirror: MirrorSettings) -> tuple[str, ...]:
    """Where a node with the origin (not air-gapped) fetches the directory from, in order."""
    if source.repo is None:
        assert source.url is not None
        return (source.url,)
    revision = source.revision or DEFAULT_REVISION
    bases = [hf_base(mirror.url, source.repo, revision)] if mirror.url else []
    if mirror.origin != "none":
        bases.append(hf_base(mirror.origin, source.repo, revision))
    return tuple(bases)


def probes_for(files: Iterable[ManifestFile], bases: Sequence[str]) -> tuple[Probe, ...]:
    """One probe per manifest file, its URL at each base (the agent's `base + quote(name)`)."""
    return tuple(Probe(f.name, tuple(b + quote(f.name) for b in bases), f.size, f.sha256) for f in files)


def _url_name(url: str) -> str:
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or url


def gguf_headers_to_read(catalog: Catalog, verdicts: Sequence[SourceVerdict]) -> dict[int, str]:
    """Verdict index -> the URL whose GGUF header to read for its architecture: a checked single-file `.gguf`
    URL source of a model with a llamacpp profile (a directory's records its shape in its manifest, which
    validate judges; a path lies on a node)."""
    out: dict[int, str] = {}
    for i, verdict in enumerate(verdicts):
        entry = catalog.models.get(verdict.model)
        source = entry.spec.source if entry is not None else None
        if (
            entry is None
            or source is None
            or source.url is None
            or source.directory
            or verdict.state != "checked"
        ):
            continue
        if urlsplit(source.url).path.lower().endswith(".gguf") and any(
            p.profile.engine == "llamacpp" for p in entry.profiles
        ):
            out[i] = source.url
    return out


def not_checked(item: SourceToCheck, why: str) -> SourceVerdict:
    return SourceVerdict(item.model, item.source, "not checked", why, item.where)


# ---------------------------------------------------------------------------------------------- the answers


def judge(item: SourceToCheck, answers: Mapping[str, Answer]) -> SourceVerdict:
    """The verdict on `item` from the answers to its probes' URLs (asked as `Probe` says: the next URL only
    after a 404). A probe whose URLs were not all asked reads as not checked."""
    if item.unchecked is not None:
        return not_checked(item, item.unchecked)
    problems: list[str] = []
    unknown: list[str] = []
    seen_at: set[str] = set()
    total = 0
    for probe in item.probes:
        outcome, words = _probe_verdict(probe, answers)
        if outcome == "error":
            problems.append(words)
        elif outcome == "not checked":
            unknown.append(words)
        else:
            seen_at.add(words)
            total += probe.size or 0
    if problems:
        first = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        return SourceVerdict(item.model, item.source, "error", first, item.where, tuple(problems))
    if unknown:
        of = f" ({len(unknown)} of {len(item.probes)} files)" if len(item.probes) > 1 else ""
        return not_checked(item, unknown[0] + of)
    files = len(item.probes)
    detail = (
        f"{files} file{'s' * (files != 1)}, {total} bytes as the repo says, at {', '.join(sorted(seen_at))}"
    )
    return SourceVerdict(item.model, item.source, "checked", detail, item.where)


def _probe_verdict(probe: Probe, answers: Mapping[str, Answer]) -> tuple[VerdictState, str]:
    """(checked, where it was) | (not checked, why) | (error, what is wrong: the file and the URL)."""
    missing: list[str] = []
    for url in probe.urls:
        answer = answers.get(url)
        if answer is None:
            return "not checked", f"{probe.name}: {url} was not asked"
        if answer.status is None:
            return "not checked", f"{url}: no answer ({answer.error or 'unknown error'})"
        if answer.status == 404:
            missing.append(url)
            continue
        if answer.status in (401, 403):
            return "not checked", f"{url} answered HTTP {answer.status} (the plan sends no origin token)"
        if not 200 <= answer.status < 300:
            return "not checked", f"{url} answered HTTP {answer.status}"
        if probe.size is not None and answer.size is not None and answer.size != probe.size:
            return "error", f"{probe.name}: {url} is {answer.size} bytes, the repo says {probe.size}"
        if probe.sha256 and answer.sha256 and answer.sha256.lower() != probe.sha256.lower():
            return "error", f"{probe.name}: {url} has sha256 {answer.sha256}, the repo says {probe.sha256}"
        return "checked", _host(url)
    return "error", f"{probe.name}: not at {' nor at '.join(missing)} (HTTP 404)"


def _host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
