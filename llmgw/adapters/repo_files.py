"""The I/O shell of the pipeline: find and read the YAML files of a cluster repo, and the committed schemas."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llmgw.core.config.errors import ConfigError
from llmgw.core.config.models import DOCUMENT_KINDS
from llmgw.core.config.schemas import schema_file_name
from llmgw.core.desired.repo import LoadResult, content_hash_of, validate_files

YAML_SUFFIXES = (".yaml", ".yml")
# schemas/ beside the llmgw package in a checkout (an editable install); absent in a wheel.
COMMITTED_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def yaml_files(root: Path) -> list[Path]:
    """Every *.yaml/*.yml under root, in path order; dot-directories (.git, .github) and dot-files skipped."""
    if root.is_file():
        return [root]
    found: list[Path] = []
    for current, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(
            Path(current) / n for n in sorted(names) if n.endswith(YAML_SUFFIXES) and not n.startswith(".")
        )
    return found


def read_files(root: Path) -> tuple[dict[str, bytes], list[ConfigError]]:
    """{display path: contents} of the repo's YAML files; unreadable files become errors."""
    files: dict[str, bytes] = {}
    errors: list[ConfigError] = []
    if not root.exists():
        return files, [
            ConfigError(str(root), 1, 1, "", "no such file or directory", "give the cluster repo's path")
        ]
    for path in yaml_files(root):
        try:
            files[str(path)] = path.read_bytes()
        except OSError as exc:
            errors.append(ConfigError(str(path), 1, 1, "", f"cannot read: {exc.strerror or exc}"))
    return files, errors


DATA_SUFFIXES = (".json",)
MAX_DATA_BYTES = 64 * 1024 * 1024  # a manifest of 100,000 files is about 15 MB


def data_files(root: Path) -> tuple[dict[str, tuple[str, bytes]], list[ConfigError]]:
    """{repo-relative path: (display path, contents)} of the repo's JSON files (manifests a Model names)."""
    found: dict[str, tuple[str, bytes]] = {}
    errors: list[ConfigError] = []
    if not root.is_dir():
        return found, errors
    for current, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if n.endswith(DATA_SUFFIXES) and not n.startswith(".")):
            path = Path(current) / name
            try:
                if path.stat().st_size > MAX_DATA_BYTES:
                    continue  # not a manifest this repo could mean; a Model naming it is told it is missing
                found[path.relative_to(root).as_posix()] = (str(path), path.read_bytes())
            except OSError as exc:
                errors.append(ConfigError(str(path), 1, 1, "", f"cannot read: {exc.strerror or exc}"))
    return found, errors


def content_hash(path: str | os.PathLike[str]) -> str:
    """The revision of a plain directory (not a git checkout): a hash of its YAML files' paths and contents."""
    root = Path(path)
    files = {str(p.relative_to(root)) if p != root else p.name: p.read_bytes() for p in yaml_files(root)}
    files.update({rel: body for rel, (_, body) in data_files(root)[0].items()})  # a manifest edit is a change
    return content_hash_of(files)


def committed_schemas(directory: Path = COMMITTED_SCHEMAS) -> dict[str, dict[str, Any]] | None:
    """Kind -> schema from the committed schemas/ files; None when they are not there (an installed wheel)."""
    out: dict[str, dict[str, Any]] = {}
    for kind in DOCUMENT_KINDS:
        try:
            out[kind] = json.loads((directory / schema_file_name(kind)).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    return out


def load_repo(path: str | os.PathLike[str], revision: str | None = None) -> LoadResult:
    """Load and validate the cluster repo at `path` (a directory, or one YAML file). Never raises on content.

    `revision` is the caller's (a commit SHA); for a plain directory it defaults to `content_hash(path)`.
    """
    root = Path(path)
    files, read_errors = read_files(root)
    data, data_errors = data_files(root)
    read_errors += data_errors
    relative = {_relative(name, root): body for name, body in files.items()}
    relative.update({rel: body for rel, (_, body) in data.items()})
    rev = revision if revision is not None else content_hash_of(relative)
    result = validate_files(files, root=str(root), revision=rev, schemas=committed_schemas(), data=data)
    if read_errors:
        errors = tuple(sorted({*result.errors, *read_errors}, key=lambda e: (e.file, e.line, e.col)))
        return LoadResult(None, errors, result.warnings, len(files))
    return result


def _relative(name: str, root: Path) -> str:
    try:
        return str(Path(name).relative_to(root))
    except ValueError:
        return Path(name).name
