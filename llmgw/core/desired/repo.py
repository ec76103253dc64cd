"""The one validation pipeline, over file contents already read: pure, and one floor above the Catalog it builds.

`llmgw.adapters.repo_files.load_repo` is the shell that reads a directory and calls it.

YAML with positions -> document shape -> JSON Schema -> pydantic -> whole-repo checks (the Catalog). Every
problem of every stage is collected, mapped to file:line:col, and returned at once; nothing raises.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmgw_agent.gguf_parts import gguf_entry
from pydantic import BaseModel

from llmgw.core.config.checks.semantic import Document, check
from llmgw.core.config.errors import ConfigError, SemanticError, format_path
from llmgw.core.config.models import DOCUMENT_KINDS, ModelSpec
from llmgw.core.config.schemas import kind_schema
from llmgw.core.config.validation import DocumentChecker, make_validators
from llmgw.core.config.yamlpos import ParsedDocument, Positions, parse_yaml
from llmgw.core.desired.catalog import Catalog
from llmgw.core.errors import CatalogError
from llmgw.core.weights.gguf_arch import PINNED, ArchitectureList, architecture_problem
from llmgw.core.weights.manifest import Manifest, ManifestFile, read_manifest
from llmgw.core.weights.memory_fit import GIB, profile_fits
from llmgw.core.weights.model_headers import ModelShape

__all__ = ["LoadResult", "LoadedDocument", "Repo", "content_hash_of", "default_schemas", "validate_files"]


@dataclass(frozen=True)
class LoadedDocument:
    file: str
    index: int  # position of the document in its file, from 0
    kind: str
    name: str
    document: BaseModel  # one of the kinds in llmgw.core.config.models
    positions: Positions


@dataclass(frozen=True)
class Repo:
    root: str
    documents: tuple[LoadedDocument, ...]
    catalog: Catalog
    revision: str | None
    # Directory sources' manifests from the repo, by model name (`spec.source.manifest`).
    manifests: Mapping[str, tuple[ManifestFile, ...]] = field(default_factory=dict)
    # The model shapes those manifests record (`llmgw model manifest` reads them from the headers).
    shapes: Mapping[str, ModelShape] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        counts = Counter(doc.kind for doc in self.documents)
        return {kind: counts[kind] for kind in DOCUMENT_KINDS if counts[kind]}


@dataclass(frozen=True)
class LoadResult:
    """Either a valid `repo`, or the `errors` that prevent one; `warnings` never block."""

    repo: Repo | None
    errors: tuple[ConfigError, ...]
    warnings: tuple[ConfigError, ...]
    files: int

    @property
    def documents(self) -> tuple[LoadedDocument, ...]:
        """The valid repo's documents; empty when there are errors."""
        return self.repo.documents if self.repo is not None else ()

    @property
    def catalog(self) -> Catalog | None:
        return self.repo.catalog if self.repo is not None else None

    @property
    def ok(self) -> bool:
        return self.repo is not None and not self.errors

    def summary(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "documents": self.repo.counts() if self.repo else {},
            "revision": self.repo.revision if self.repo else None,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
        }


def content_hash_of(files: Mapping[str, bytes]) -> str:
    """A revision id for a plain directory: sha256 over each file's path and contents, in path order."""
    digest = hashlib.sha256()
    for name in sorted(files):
        body = files[name]
        digest.update(f"{name}\0{len(body)}\0".encode())
        digest.update(body)
    return "sha256:" + digest.hexdigest()


def default_schemas() -> dict[str, dict[str, Any]]:
    """Kind -> schema, generated from the models (identical to schemas/ while that is not stale)."""
    return {kind: kind_schema(kind) for kind in DOCUMENT_KINDS}


def validate_files(
    files: Mapping[str, bytes],
    *,
    root: str = ".",
    revision: str | None = None,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
    data: Mapping[str, tuple[str, bytes]] | None = None,
) -> LoadResult:
    """Validate a cluster repo given as {display path: contents}. `revision` defaults to a content hash.
    `data` is the repo's other files a document may name (manifests): {repo-relative path: (display, body)}."""
    checker = DocumentChecker(make_validators(schemas if schemas is not None else default_schemas()))
    errors: list[ConfigError] = []
    good: list[LoadedDocument] = []
    broken: dict[str, set[str]] = {}
    for name in sorted(files):
        parsed, parse_errors = parse_yaml(name, files[name])
        errors.extend(parse_errors)
        for doc in parsed:
            loaded = _check_document(checker, doc, errors)
            if loaded is not None:
                good.append(loaded)
            else:
                _remember_broken(doc, broken)
    tolerate = {kind: frozenset(names) for kind, names in broken.items()}
    semantic = check([d.document for d in good], tolerate)  # type: ignore[misc]
    mapped = [_position(good, problem) for problem in semantic]
    errors.extend(e for e in mapped if e.severity == "error")
    read = _manifests(good, data or {}, errors)
    errors.extend(_fit_problems(good, read))
    errors.extend(_architecture_problems(good, read, PINNED))
    manifests = {name: m.files for name, m in read.items()}
    shapes = {name: m.shape for name, m in read.items() if m.shape is not None}
    warnings = tuple(sorted({e for e in mapped if e.severity == "warning"}, key=_order))
    unique_errors = tuple(sorted(set(errors), key=_order))
    if unique_errors:
        return LoadResult(None, unique_errors, warnings, len(files))
    revision = revision if revision is not None else content_hash_of(files)
    try:
        documents = [d.document for d in good]
        catalog = Catalog.build(
            documents,  # type: ignore[arg-type]
            revision=revision,
            manifests=manifests,
            shapes=shapes,
        )
    except CatalogError as exc:  # the same checks ran above; kept so a disagreement cannot pass silently
        return LoadResult(None, tuple(_position(good, p) for p in exc.errors), warnings, len(files))
    repo = Repo(root, tuple(good), catalog, revision, manifests, shapes)
    return LoadResult(repo, (), warnings, len(files))


def _manifests(
    good: list[LoadedDocument], data: Mapping[str, tuple[str, bytes]], errors: list[ConfigError]
) -> dict[str, Manifest]:
    """Each Model's `spec.source.manifest`, read from the repo's files and checked (problems go to `errors`:
    a missing file at the Model's line, a bad manifest at the manifest's own lines, a context_length above the
    trained context the manifest records at the context_length)."""
    out: dict[str, Manifest] = {}
    for doc in good:
        source = getattr(getattr(doc.document, "spec", None), "source", None)
        named = getattr(source, "manifest", None) if doc.kind == "Model" else None
        if not isinstance(named, str):
            continue
        path = ("spec", "source", "manifest")
        pos = doc.positions.value(path)
        rel = named.removeprefix("./")
        if rel.startswith("/") or ".." in rel.split("/") or rel not in data:
            errors.append(
                ConfigError(
                    doc.file,
                    pos.line,
                    pos.col,
                    format_path(path),
                    f"no manifest file {named!r} in the repo",
                    "a .json file inside the repo, path from its root; write it with `llmgw model manifest`",
                )
            )
            continue
        display, body = data[rel]
        manifest, problems = read_manifest(display, body)
        errors.extend(problems)
        if manifest is not None:
            out[doc.name] = manifest
            errors.extend(_context_problems(doc, manifest, display))
            errors.extend(_gguf_problems(doc, manifest, display))
    return out


def _fit_problems(good: list[LoadedDocument], read: Mapping[str, Manifest]) -> list[ConfigError]:
    """A GPU profile that cannot fit the memory its class declares (Cluster `gpu_classes`), with the arithmetic,
    at the profile; only for models whose manifest records their shape."""
    cluster = next((d.document for d in good if d.kind == "Cluster"), None)
    classes = getattr(getattr(cluster, "spec", None), "gpu_classes", None) or {}
    memory = {name: int(c.memory_gb * GIB) for name, c in classes.items()}
    out: list[ConfigError] = []
    for doc in good:
        manifest = read.get(doc.name) if doc.kind == "Model" else None
        spec = getattr(doc.document, "spec", None)
        if manifest is None or manifest.shape is None or not isinstance(spec, ModelSpec):
            continue
        for fit in profile_fits({doc.name: (spec, manifest.shape)}, memory):
            if fit.state != "does not fit":
                continue
            index = next(i for i, p in enumerate(spec.profiles) if p.name == fit.profile)
            path: tuple[str | int, ...] = ("spec", "profiles", index)
            pos = doc.positions.value(path)
            words = f"on {fit.gpu_class} ({classes[fit.gpu_class].memory_gb:g} GiB): {fit.words()}"
            hint = "more tp or pp, a larger gpu_class, fewer slots or a shorter context_length"
            out.append(
                ConfigError(
                    doc.file, pos.line if pos else 1, pos.col if pos else 1, format_path(path), words, hint
                )
            )
    return out


def _architecture_problems(
    good: list[LoadedDocument], read: Mapping[str, Manifest], llamacpp: ArchitectureList
) -> list[ConfigError]:
    """A llamacpp profile of a GGUF whose recorded architecture the llama.cpp build does not load, at the
    profile, with the build's list: it would be fetched and placed, then fail on every node."""
    out: list[ConfigError] = []
    for doc in good:
        manifest = read.get(doc.name) if doc.kind == "Model" else None
        spec = getattr(doc.document, "spec", None)
        shape = manifest.shape if manifest is not None else None
        if shape is None or shape.format != "gguf" or not isinstance(spec, ModelSpec):
            continue
        problem = architecture_problem(shape.architecture, llamacpp)
        if problem is None:
            continue
        for index, profile in enumerate(spec.profiles):
            if profile.engine != "llamacpp":
                continue
            path: tuple[str | int, ...] = ("spec", "profiles", index)
            pos = doc.positions.value(path)
            hint = "a GGUF of an architecture that build loads, or a newer llama.cpp (docs/engines.md)"
            out.append(
                ConfigError(
                    doc.file, pos.line if pos else 1, pos.col if pos else 1, format_path(path), problem, hint
                )
            )
    return out


def _context_problems(doc: LoadedDocument, manifest: Manifest, display: str) -> list[ConfigError]:
    """A declared context_length above what the model was trained for: the engine refuses it or degrades."""
    trained = manifest.shape.trained_context if manifest.shape else None
    declared = getattr(getattr(doc.document, "spec", None), "context_length", None)
    if trained is None or not isinstance(declared, int) or declared <= trained:
        return []
    words = f"{declared} is above the model's trained context {trained} (recorded in {display})"
    return [_error_at(doc, ("spec", "context_length"), words, f"at most {trained}")]


def _error_at(doc: LoadedDocument, path: tuple[str, ...], message: str, hint: str) -> ConfigError:
    pos = doc.positions.value(path)
    return ConfigError(
        doc.file, pos.line if pos else 1, pos.col if pos else 1, format_path(path), message, hint
    )


def _gguf_problems(doc: LoadedDocument, manifest: Manifest, display: str) -> list[ConfigError]:
    """A llama.cpp profile over a directory with no GGUF, several, or a split set missing parts: llama-server is
    given one file (the first part of a split) and would fail at start."""
    spec = getattr(doc.document, "spec", None)
    if not isinstance(spec, ModelSpec) or not any(p.engine == "llamacpp" for p in spec.profiles):
        return []
    entry = gguf_entry(f.name for f in manifest.files)
    if entry.problem is None:
        return []
    words = f"llama.cpp profiles need one GGUF model in the directory; {display}: {entry.problem}"
    hint = (
        "list the .gguf file, or every part of the split set (NAME-00001-of-0000N.gguf ...), in the manifest"
    )
    return [_error_at(doc, ("spec", "source", "manifest"), words, hint)]


def _check_document(
    checker: DocumentChecker, doc: ParsedDocument, errors: list[ConfigError]
) -> LoadedDocument | None:
    if not doc.ok:
        return None
    model, doc_errors = checker.check(doc)
    errors.extend(doc_errors)
    if model is None:
        return None
    typed: Document = model  # type: ignore[assignment]
    return LoadedDocument(doc.file, doc.index, typed.kind, typed.metadata.name, model, doc.positions)


def _remember_broken(doc: ParsedDocument, broken: dict[str, set[str]]) -> None:
    """Names a failed document would have defined, so references to it are not reported as missing too."""
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return
    kind = data["kind"]
    names = broken.setdefault(kind, set())
    metadata = data.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
        names.add(metadata["name"])
    spec = data.get("spec")
    if kind == "Model" and isinstance(spec, dict) and isinstance(spec.get("aliases"), list):
        names.update(a for a in spec["aliases"] if isinstance(a, str))


def _position(good: list[LoadedDocument], problem: SemanticError) -> ConfigError:
    doc = good[problem.document]
    pos = doc.positions.value(problem.path)
    if problem.path and problem.path[-1] == "name":
        pos = doc.positions.value(problem.path)
    return ConfigError(
        doc.file,
        pos.line,
        pos.col,
        format_path(problem.path),
        problem.message,
        problem.hint,
        problem.severity,
    )


def _order(error: ConfigError) -> tuple[str, int, int, str, str]:
    return (error.file, error.line, error.col, error.path, error.message)
