"""The node's weights index: which files and directories llmgw fetched, their size, and which shards use each.

Kept as one JSON file in the agent's state dir, beside the shard records, and rewritten whole (write, then
rename) on every change. An entry is named by its source's identity: `url:URL` for a fetched file, `path:PATH`
for weights the repo named on the node, `dir:NAME@DIGEST` for a published directory source (its name and its
manifest's digest). The controller reads the same identity (the url or path and the sha256; the directory's
name and digest) to know which model's weights a node holds.

Only fetched entries can ever be collected, and the agent checks each again before deleting it, because the
controller must not be able to talk a node into deleting something: the file must lie where `cache_path` puts
that URL (a directory named by the hash of the URL, inside the cache) or, for a directory, be a `model`
directory directly under a `dir-<hash>` root in the cache; no running shard may use it, and no declared source
the controller sent may name it (a kept directory by its name, and its digest when the controller gives one). Anything else in the cache (a file copied by hand, one an
agent before this index fetched) is not in the index and is never touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_agent.dirfetch import DIRECTORY_PREFIX, PUBLISHED
from llmgw_agent.origins import read_record
from llmgw_agent.protocol import CachedWeights, WeightSource
from llmgw_agent.weights import WeightsError, cache_path

log = logging.getLogger(__name__)
INDEX_FILE = "weights-index.json"
_DIRECTORY_ROOT = re.compile(re.escape(DIRECTORY_PREFIX) + r"[0-9a-f]{24}")


@dataclass
class _Entry:
    url: str | None
    path: str | None
    sha256: str | None
    local_path: str
    fetched: bool
    users: set[str] = field(default_factory=set)  # shard ids
    last_used: float | None = None
    directory: str | None = None  # a directory source's name; then `manifest_sha256` is its digest
    manifest_sha256: str | None = None

    def identity(self) -> str:
        if self.directory is not None:
            return f"dir:{self.directory}@{self.manifest_sha256}"
        return f"url:{self.url}" if self.url is not None else f"path:{self.path}"


def _size(path: Path) -> int | None:
    """Bytes of a file, or of every file under a directory; None when it is gone."""
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return None
    return None


def _replica_of(shard_id: str) -> str:
    return shard_id.rsplit("-", 1)[0]


class WeightsIndex:
    def __init__(self, index_file: Path, cache_dir: Path) -> None:
        self.index_file = index_file
        self.cache_dir = cache_dir
        self.entries: dict[str, _Entry] = {}
        self.on_change: Callable[[], None] = lambda: None
        self._load()

    def _load(self) -> None:
        try:
            raw = json.loads(self.index_file.read_text())
            for item in raw.get("entries", []):
                entry = _Entry(
                    url=item.get("url"),
                    path=item.get("path"),
                    sha256=item.get("sha256"),
                    local_path=str(item["local_path"]),
                    fetched=bool(item.get("fetched")),
                    users=set(item.get("users", [])),
                    last_used=item.get("last_used"),
                    directory=item.get("directory"),
                    manifest_sha256=item.get("manifest_sha256"),
                )
                self.entries[entry.identity()] = entry
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Starting empty forgets what was fetched (so nothing is collectable): safe, and said once.
            log.warning("weights index %s is unreadable (%s): starting a new one", self.index_file, exc)

    def _save(self) -> None:
        items: list[dict[str, Any]] = [
            {
                "url": e.url,
                "path": e.path,
                "sha256": e.sha256,
                "local_path": e.local_path,
                "fetched": e.fetched,
                "users": sorted(e.users),
                "last_used": e.last_used,
            }
            | ({"directory": e.directory, "manifest_sha256": e.manifest_sha256} if e.directory else {})
            for e in sorted(self.entries.values(), key=_Entry.identity)
        ]
        self.index_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.index_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"entries": items}, indent=1))
        os.replace(tmp, self.index_file)
        self.on_change()

    # ---- changes ----

    def record(self, source: WeightSource, local_path: str, shard_id: str) -> None:
        """`shard_id` runs on the weights of `source`, which lie at `local_path` (fetched when a URL)."""
        fetched = source.url is not None
        entry = _Entry(source.url, None if fetched else source.path, source.sha256, local_path, fetched)
        entry = self.entries.setdefault(entry.identity(), entry)
        entry.sha256 = source.sha256 or entry.sha256
        self._use(entry, local_path, shard_id)

    def record_directory(self, directory: str, digest: str, local_path: str, shard_id: str) -> None:
        """`shard_id` runs on the published directory `directory` (manifest digest `digest`) at `local_path`."""
        entry = _Entry(None, None, None, local_path, True, directory=directory, manifest_sha256=digest)
        self._use(self.entries.setdefault(entry.identity(), entry), local_path, shard_id)

    def _use(self, entry: _Entry, local_path: str, shard_id: str) -> None:
        entry.local_path = local_path
        entry.users.add(shard_id)
        entry.last_used = time.time()
        self._save()

    def release(self, shard_id: str) -> None:
        """The shard no longer runs: its weights stay on disk, used by one shard fewer."""
        changed = False
        for entry in self.entries.values():
            if shard_id in entry.users:
                entry.users.discard(shard_id)
                entry.last_used = time.time()
                changed = True
        if changed:
            self._save()

    def retain_users(self, running: Iterable[str]) -> None:
        """After a restart: only shards still running use anything."""
        alive = set(running)
        changed = False
        for entry in self.entries.values():
            gone = entry.users - alive
            if gone:
                entry.users -= gone
                changed = True
        if changed:
            self._save()

    # ---- reports ----

    def report(self) -> list[CachedWeights]:
        """Entries whose files are still there (an operator's path that vanished is simply not reported)."""
        out: list[CachedWeights] = []
        for entry in sorted(self.entries.values(), key=_Entry.identity):
            size = _size(Path(entry.local_path))
            if size is None:
                continue
            out.append(
                CachedWeights(
                    url=entry.url,
                    path=entry.path,
                    sha256=entry.sha256,
                    directory=entry.directory,
                    manifest_sha256=entry.manifest_sha256,
                    size_bytes=size,
                    local_path=entry.local_path,
                    fetched=entry.fetched,
                    used_by=sorted({_replica_of(u) for u in entry.users}),
                    last_used=entry.last_used,
                    # Beside `model/` in its dir-<hash> root (llmgw_agent.dirfetch writes it as files arrive).
                    origin=read_record(Path(entry.local_path).parent) if entry.directory else None,
                )
            )
        return out

    # ---- collection ----

    def collect(self, keep: Iterable[WeightSource], dry_run: bool) -> dict[str, Any]:
        """Delete (or, dry, name) fetched files no running shard uses and no kept source names."""
        keep = list(keep)
        kept_urls = {s.url for s in keep if s.url and not s.directory}
        kept_hashes = {s.sha256.lower() for s in keep if s.sha256}
        removed: list[dict[str, Any]] = []
        refused: list[dict[str, str]] = []
        for key, entry in sorted(self.entries.items()):
            if not entry.fetched or entry.users or _kept_directory(entry, keep):
                continue
            if entry.url in kept_urls or (entry.sha256 and entry.sha256.lower() in kept_hashes):
                continue
            problem = self._not_ours(entry)
            if problem is not None:
                refused.append({"local_path": entry.local_path, "reason": problem})
                continue
            size = _size(Path(entry.local_path))
            removed.append(
                {"url": entry.url, "local_path": entry.local_path, "size_bytes": size}
                | ({"directory": entry.directory} if entry.directory else {})
            )
            if not dry_run:
                self._delete(Path(entry.local_path))
                del self.entries[key]
        if not dry_run and removed:
            self._save()
        return {"dry_run": dry_run, "removed": removed, "refused": refused}

    def _not_ours(self, entry: _Entry) -> str | None:
        """Why the agent will not delete this entry's file, or None when it provably fetched it."""
        if entry.directory is not None:
            return self._not_our_directory(Path(entry.local_path))
        if entry.url is None:
            return "not fetched by llmgw"
        try:
            expected = cache_path(self.cache_dir, entry.url)
        except WeightsError as exc:
            return str(exc)
        local = Path(entry.local_path)
        if local.is_symlink() or local.resolve() != expected.resolve():
            return f"not where the cache puts {entry.url} ({expected})"
        return None

    def _not_our_directory(self, local: Path) -> str | None:
        """A published directory is `<cache>/dir-<24 hex>/model`, and no link on the way."""
        root = local.parent
        cache = self.cache_dir.resolve()
        shaped = local.name == PUBLISHED and _DIRECTORY_ROOT.fullmatch(root.name) is not None
        if not shaped or local.is_symlink() or root.is_symlink() or root.resolve().parent != cache:
            return f"not where the cache publishes a directory ({cache}/{DIRECTORY_PREFIX}<hash>/{PUBLISHED})"
        return None

    @staticmethod
    def _delete(path: Path) -> None:
        if path.is_dir() and not path.is_symlink():
            # The whole dir-<hash> root: the published model and whatever staging an earlier fetch left.
            shutil.rmtree(path.parent, ignore_errors=True)
            return
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".part").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the hash-named directory, when nothing else is in it


def _kept_directory(entry: _Entry, keep: list[WeightSource]) -> bool:
    """A declared directory source names this entry: by name, and by digest when the controller gives one (a
    name whose manifest moved on leaves the old bytes collectable)."""
    if entry.directory is None:
        return False
    return any(
        s.directory == entry.directory and s.manifest_sha256 in (None, entry.manifest_sha256) for s in keep
    )
