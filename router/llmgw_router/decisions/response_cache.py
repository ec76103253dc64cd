"""The response cache's decisions and its memory: which requests it may answer, the key, the LRU per project.

No I/O here: `path/cache.py` is the shell that reads the request, serves a hit and stores a miss. Rules:

- Opt-in per project (`Project.spec.response_cache`), held per project in this router's memory, never
  consulted for another project: the maps are apart, and the project is in the key as well.
- The key is a SHA-256 of a canonical JSON (keys sorted, no spaces) of the endpoint kind, the canonical model
  (an alias and the name it stands for share entries) and the body minus the fields that never change the
  answer (`IGNORED_FIELDS`). `stream` and `stream_options` stay in it: a stream is stored and replayed as the
  chunks the client got, so a whole answer never answers a stream, nor one without the usage chunk one that
  asked for it.
- `cache-control: no-cache` skips the lookup and stores the answer; `no-store` does neither.
- Only a complete 200 from the model asked for (not a fallback's), no larger than `max_entry_bytes`, is kept.
- Each project's entries are bounded by its `max_bytes` (the stored bytes plus a fixed overhead per entry);
  the least recently used go first. An entry older than the TTL is never served and goes when found.
"""

from __future__ import annotations

import fnmatch
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from llmgw.core.config.models import ProjectSpec, ResponseCacheSpec
from llmgw.core.words import parse_duration

__all__ = [
    "ENTRY_OVERHEAD",
    "IGNORED_FIELDS",
    "CacheEntry",
    "Directive",
    "ProjectCache",
    "ResponseCache",
    "cache_key",
    "directive",
]

# Fields that change who is billed or what is kept, never the answer: left out of the key.
IGNORED_FIELDS = frozenset({"model", "user", "metadata", "store", "service_tier"})
# What an entry costs besides its bytes (the key, the record, the map's slot), so that many tiny answers are
# bounded by max_bytes too.
ENTRY_OVERHEAD = 256
Directive = Literal[
    "use", "refresh", "bypass"
]  # look up and store; store only (no-cache); neither (no-store)


def directive(cache_control: str | None) -> Directive:
    """The client's `cache-control` request header as the cache reads it (other directives are ignored)."""
    if not cache_control:
        return "use"
    words = {part.strip().split("=", 1)[0].lower() for part in cache_control.split(",")}
    if "no-store" in words:
        return "bypass"
    if "no-cache" in words:
        return "refresh"
    return "use"


def cache_key(project: str, kind: str, model: str, body: Mapping[str, Any]) -> str:
    """The exact-match key: hex SHA-256 of the canonical JSON of what decides the answer."""
    kept = {k: v for k, v in body.items() if k not in IGNORED_FIELDS}
    canonical = orjson.dumps(
        {"project": project, "kind": kind, "model": model, "body": kept}, option=orjson.OPT_SORT_KEYS
    )
    return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One stored answer: a whole body, or a stream's bytes as the client got them (SSE events)."""

    stream: bool
    body: bytes
    content_type: str
    prompt_tokens: int | None
    completion_tokens: int | None
    events: int  # stream events with data (what a replay counts as forwarded)
    stored_at: float
    expires_at: float
    dropped_fields: str | None = None  # the x-llmgw-dropped-fields the first answer carried

    @property
    def size(self) -> int:
        return len(self.body) + ENTRY_OVERHEAD


class ProjectCache:
    """One project's entries, least recently used first, bounded by bytes."""

    def __init__(self, spec: ResponseCacheSpec, evicted: Callable[[], None] = lambda: None) -> None:
        self.spec = spec
        self._evicted = evicted
        self.ttl = parse_duration(spec.ttl)
        self.entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self.bytes = 0

    def covers(self, model: str) -> bool:
        patterns = self.spec.models
        return patterns is None or any(fnmatch.fnmatchcase(model, p) for p in patterns)

    def get(self, key: str, now: float) -> CacheEntry | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        if now >= entry.expires_at:
            self._drop(key)
            return None
        self.entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: CacheEntry) -> bool:
        """Store `entry` (False when it is over max_entry_bytes), evicting the least recently used."""
        if len(entry.body) > self.spec.max_entry_bytes:
            return False
        if key in self.entries:
            self._drop(key)
        self.entries[key] = entry
        self.bytes += entry.size
        while self.bytes > self.spec.max_bytes and self.entries:
            self._drop(next(iter(self.entries)))
            self._evicted()
        return key in self.entries

    def _drop(self, key: str) -> None:
        self.bytes -= self.entries.pop(key).size


class ResponseCache:
    """Every project's cache in this router; rebuilt for a project whose settings changed (its entries go:
    they were stored under the old TTL and bound)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # the TTL's clock; tests replace it
        self.projects: dict[str, ProjectCache] = {}
        self.evictions = 0  # answers dropped for room, over the router's life (a counter)

    def configure(self, projects: Mapping[str, ProjectSpec]) -> None:
        kept: dict[str, ProjectCache] = {}
        for name, spec in projects.items():
            if spec.response_cache is None:
                continue
            have = self.projects.get(name)
            same = have is not None and have.spec == spec.response_cache
            kept[name] = (
                have if have is not None and same else ProjectCache(spec.response_cache, self._evicted)
            )
        self.projects = kept

    def _evicted(self) -> None:
        self.evictions += 1

    def for_request(self, project: str | None, model: str) -> ProjectCache | None:
        """The cache that may answer `project`'s request for `model`, or None (not opted in, not this model)."""
        if project is None:
            return None
        cache = self.projects.get(project)
        return cache if cache is not None and cache.covers(model) else None

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.projects.values())

    @property
    def entries(self) -> int:
        return sum(len(c.entries) for c in self.projects.values())
