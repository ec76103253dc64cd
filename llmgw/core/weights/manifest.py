"""A directory source's manifest: the files of a model directory, with sizes and sha256. Pure.

Written by `llmgw model manifest` (or `llmgw mirror add`) as JSON, stored in the cluster repo beside the Model
(`spec.source.manifest: manifests/qwen.json`) or published by a mirror as DIR/llmgw-manifest.json. `llmgw
validate` checks a repo manifest offline: its shape, every name (the agent's per-segment rule), a size and a
sha256 for each file, no name twice. JSON is YAML, so the YAML reader gives every problem its line and column.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmgw_agent import repo_rules
from llmgw_agent.protocol import DirectoryManifest, WeightFile, manifest_digest

from llmgw.core.config.errors import ConfigError, PathPart, format_path
from llmgw.core.config.yamlpos import Positions, parse_yaml
from llmgw.core.weights.model_headers import ModelShape

__all__ = [
    "FORMAT",
    "Manifest",
    "ManifestFile",
    "digest",
    "manifest_json",
    "parse_manifest",
    "read_manifest",
    "total_bytes",
]

FORMAT = "llmgw-manifest/1"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_FILES = 100_000


@dataclass(frozen=True)
class ManifestFile:
    name: str
    size: int
    sha256: str


def total_bytes(files: Iterable[ManifestFile | WeightFile]) -> int:
    return sum(f.size for f in files)


def digest(files: Iterable[ManifestFile | WeightFile]) -> str:
    """The manifest's content digest (llmgw_agent.protocol.manifest_digest): what a node's weights index names
    a published directory by, and what a replica's fingerprint carries, so a manifest edited in place is new."""
    return manifest_digest((f.name, f.size, f.sha256) for f in files)


@dataclass(frozen=True)
class Manifest:
    files: tuple[ManifestFile, ...]
    # The model's shape from its headers (`llmgw model manifest` records it); None: not recorded.
    shape: ModelShape | None = None


def manifest_json(files: Iterable[ManifestFile], shape: ModelShape | None = None) -> dict[str, Any]:
    """The manifest document, files in name order (so a rewrite of the same directory is the same text), and
    the model's shape when known (agents ignore it; offline `validate` reads it)."""
    ordered = sorted(files, key=lambda f: f.name)
    body = DirectoryManifest(
        files=[WeightFile(name=f.name, size=f.size, sha256=f.sha256) for f in ordered]
    ).model_dump()
    return body | ({"model": shape.to_json()} if shape is not None else {})


class _Problems:
    def __init__(self, file: str, positions: Positions | None) -> None:
        self.file, self.positions, self.errors = file, positions, list[ConfigError]()

    def add(self, path: tuple[PathPart, ...], message: str, hint: str | None = None) -> None:
        pos = self.positions.value(path) if self.positions else None
        line, col = (pos.line, pos.col) if pos else (1, 1)
        self.errors.append(ConfigError(self.file, line, col, format_path(path), message, hint))


def parse_manifest(file: str, body: bytes) -> tuple[tuple[ManifestFile, ...], list[ConfigError]]:
    """The files a manifest lists, or the problems that make it unusable (each at its line and column)."""
    manifest, errors = read_manifest(file, body)
    return (manifest.files if manifest is not None else ()), errors


def read_manifest(file: str, body: bytes) -> tuple[Manifest | None, list[ConfigError]]:
    """The manifest (files and recorded shape), or the problems that make it unusable."""
    docs, errors = parse_yaml(file, body)
    if errors:
        return None, errors
    problems = _Problems(file, docs[0].positions if docs else None)
    data = docs[0].data if len(docs) == 1 else None
    if not isinstance(data, Mapping):
        problems.add((), "a manifest is one JSON object", "write it with `llmgw model manifest DIR -o FILE`")
        return None, problems.errors
    if data.get("format", FORMAT) != FORMAT:
        problems.add(
            ("format",), f"unknown manifest format {data.get('format')!r}", f"this llmgw reads {FORMAT}"
        )
    extra = sorted(set(data) - {"format", "files", "model"})
    if extra:
        problems.add(
            (extra[0],), f"unknown field {extra[0]!r}", "a manifest has `format`, `files` and `model`"
        )
    shape = _shape(data.get("model"), problems)
    entries = data.get("files")
    if not isinstance(entries, list) or not entries:
        problems.add(("files",), "`files` must be a non-empty list", "one {name, size, sha256} per file")
        return None, problems.errors
    if len(entries) > MAX_FILES:
        problems.add(("files",), f"more than {MAX_FILES} files", None)
        return None, problems.errors
    indexed = [(i, f) for i, e in enumerate(entries) if (f := _file(i, e, problems)) is not None]
    seen: set[str] = set()
    for i, f in indexed:
        if f.name in seen:
            problems.add(("files", i, "name"), f"{f.name!r} is listed twice", "each file once")
        seen.add(f.name)
    if problems.errors:
        return None, problems.errors
    return Manifest(tuple(f for _, f in indexed), shape), []


_SHAPE_TEXT = frozenset({"format", "architecture", "dtype", "quantization"})


def _shape(value: object, problems: _Problems) -> ModelShape | None:
    """The recorded `model` shape: known fields are whole numbers (or text), null when unknown."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        problems.add(("model",), "`model` is an object", "as `llmgw model manifest` records it")
        return None
    before = len(problems.errors)
    known = set(ModelShape.__dataclass_fields__)
    for key, item in value.items():
        if key not in known or item is None:
            continue  # a field a newer llmgw records: ignored, not refused
        text = key in _SHAPE_TEXT
        if (text and not isinstance(item, str)) or (
            not text and (not isinstance(item, int) or isinstance(item, bool) or item < 0)
        ):
            what = "text" if text else "a whole number, 0 or more"
            problems.add(("model", key), f"`{key}` must be {what} (or null: unknown)", None)
    if len(problems.errors) != before:
        return None
    return ModelShape.from_json({"format": "unknown", **value})


def _file(i: int, entry: object, problems: _Problems) -> ManifestFile | None:
    path: tuple[PathPart, ...] = ("files", i)
    if not isinstance(entry, Mapping):
        problems.add(path, "each file is an object", '{"name": ..., "size": ..., "sha256": ...}')
        return None
    before = len(problems.errors)
    name, size, sha = entry.get("name"), entry.get("size"), entry.get("sha256")
    if not isinstance(name, str):
        problems.add((*path, "name"), "a file needs a `name` (a relative path)", None)
    elif (problem := repo_rules.manifest_name_problem(name)) is not None:
        problems.add((*path, "name"), problem, "a relative path of plain names, e.g. model-00001.safetensors")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        problems.add((*path, "size"), "a file needs its `size` in bytes (a whole number, 0 or more)", None)
    if not isinstance(sha, str) or not _SHA256.match(sha):
        problems.add((*path, "sha256"), "a file needs its `sha256` (64 lower-case hex digits)", None)
    extra = sorted(set(entry) - {"name", "size", "sha256"})
    if extra:
        problems.add((*path, extra[0]), f"unknown field {extra[0]!r}", "a file has name, size and sha256")
    if len(problems.errors) != before:
        return None
    assert isinstance(name, str) and isinstance(size, int) and isinstance(sha, str)
    return ManifestFile(name, size, sha)
