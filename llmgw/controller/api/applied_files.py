"""The files an admin `apply` sends (`{"files": {path: text}}`), as a directory the controller can load.

They land in `STATE_DIR/applied/<digest of the files>/`. Everything is checked before anything is written: each
path relative and inside that directory, each value text, at most MAX_FILES files and MAX_BYTES of text in all
(a cluster repo is YAML, not weights). After each write the oldest payload directories are removed, keeping the
KEPT newest and the one the applied revision was loaded from (its secret files are read from there later), so
an `apply` token can fill neither the disk nor the directory listing.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

__all__ = ["KEPT", "MAX_BYTES", "MAX_FILES", "files_problem", "prune", "to_prune", "write_files"]

MAX_FILES = 2000
MAX_BYTES = 8 * 1024 * 1024  # of text over every file, UTF-8
KEPT = 8  # payload directories kept besides the applied revision's


def files_problem(files: dict[Any, Any]) -> str | None:
    """Why these files cannot be applied (the first problem, in words), or None. Pure: no path is touched."""
    if len(files) > MAX_FILES:
        return (
            f"{len(files)} files sent; an apply takes at most {MAX_FILES} (a cluster repo is YAML documents)"
        )
    total = 0
    for rel, text in files.items():
        if not isinstance(rel, str) or not isinstance(text, str):
            return f"file {rel!r}: must be a relative path inside the repo with text content"
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            return f"file {rel!r}: must be a relative path inside the repo with text content"
        total += len(text.encode("utf-8", "surrogatepass"))
        if total > MAX_BYTES:
            return (
                f"the files sent hold more than {MAX_BYTES} bytes of text (at {rel!r}); an apply takes YAML "
                "documents, not data files"
            )
    return None


def write_files(applied_dir: Path, files: dict[str, str]) -> Path:
    """Write checked `files` (see files_problem) under `applied_dir/<digest>/` and return that directory."""
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:16]
    root = (applied_dir / digest).resolve()
    for rel, text in files.items():
        target = (root / rel).resolve()
        if root not in target.parents:  # a symlink placed earlier cannot lead a later write out
            raise ValueError(f"file {rel!r}: must be a relative path inside the repo with text content")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    root.touch()  # the same files sent again are the newest payload again
    return root


def to_prune(dirs: list[tuple[Path, float]], keep: set[Path], kept: int = KEPT) -> list[Path]:
    """Of (directory, mtime) pairs, those to remove: all but the `kept` newest and those in `keep`."""
    newest_first = sorted(dirs, key=lambda d: d[1], reverse=True)
    return [path for path, _ in newest_first[kept:] if path not in keep]


def prune(applied_dir: Path, keep: set[Path]) -> list[Path]:
    """Remove the payload directories `to_prune` names; returns them."""
    dirs = [(p.resolve(), p.stat().st_mtime) for p in applied_dir.iterdir() if p.is_dir()]
    gone = to_prune(dirs, {k.resolve() for k in keep})
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone
