"""Recorded traffic, pure: the salted prefix hash a router records, a usage row as a trace line and back, and
the per-minute aggregates the controller keeps after it prunes per-request rows (issue 21).

A usage row is written when a request completes: `time` is its completion and `latency_ms` its duration, so
its arrival is `time - latency_ms / 1000`. The trace format itself is `llmgw.core.traffic.trace`'s.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmgw.core.config.models import ContentRetention
from llmgw.core.tenancy.limits import window_bounds
from llmgw.core.words import parse_duration

__all__ = [
    "IMPORT_PREFIX",
    "Finished",
    "MinuteTotal",
    "aggregate_minutes",
    "content_ttl",
    "merge_minutes",
    "minute_of",
    "prefix_hash",
    "trace_salt",
    "usage_cutoff",
]

IMPORT_PREFIX = "import:"  # router_id of rows `llmgw traffic import` wrote: `import:<source>`
_SALT_LABEL = b"llmgw-trace-salt\0"
_PREFIX_LABEL = b"llmgw-prefix"  # BLAKE2b's personalisation: at most 16 bytes


def trace_salt(cluster_secret: bytes) -> str:
    """The secret every router salts prefix hashes with, derived from the cluster secret (like the router
    token), so the same session hashes alike on every router and across restarts."""
    if not cluster_secret:
        raise ValueError("trace_salt needs a non-empty cluster secret")
    return hmac.new(cluster_secret, _SALT_LABEL, hashlib.sha256).hexdigest()


def prefix_hash(salt: bytes, project: str, key: str) -> str:
    """What a usage row keeps of a request's session/prefix key: 24 hex digits of a MAC under the salt of the
    project and the key, so two projects' hashes never match and the key cannot be read back. Keyed BLAKE2b
    is a MAC by design and costs a third of an HMAC-SHA256 in Python; it is on every request's path."""
    message = project.encode() + b"\0" + key.encode("utf-8", "surrogateescape")
    return hashlib.blake2b(message, key=salt[:64], digest_size=12, person=_PREFIX_LABEL).hexdigest()


def minute_of(t: float) -> float:
    """The start of the minute `t` falls in (unix seconds)."""
    return math.floor(t / 60.0) * 60.0


@dataclass(frozen=True, slots=True)
class Finished:
    """One request as the aggregates need it: when it completed and how long it took."""

    completed: float
    latency_s: float
    model: str
    project: str
    source: str  # "" for a router's row, `import:<name>` for an imported one
    status: int
    tokens_in: int
    tokens_out: int
    cost: float

    @property
    def arrived(self) -> float:
        return self.completed - max(self.latency_s, 0.0)


@dataclass(frozen=True, slots=True)
class MinuteTotal:
    """One (minute, model, project, source)'s requests, counted by completion minute. `peak_concurrency`
    is the most of the group's requests in flight at once during the minute; None: unknown."""

    minute: float
    model: str
    project: str
    source: str
    requests: int
    errors: int
    tokens_in: int
    tokens_out: int
    cost: float
    peak_concurrency: int | None

    @property
    def key(self) -> tuple[float, str, str, str]:
        return (self.minute, self.model, self.project, self.source)


Group = tuple[str, str, str]  # model, project, source


def _peaks(rows: Iterable[Finished], minutes: set[float]) -> dict[tuple[float, str, str, str], int]:
    """The most requests in flight at once, per group and minute in `minutes`, by a sweep over arrivals and
    completions (a completion at the same instant as an arrival goes first: the slot was handed over)."""
    events: dict[Group, list[tuple[float, int]]] = defaultdict(list)
    for r in rows:
        group = (r.model, r.project, r.source)
        events[group].append((r.arrived, 1))
        events[group].append((r.completed, -1))
    peaks: dict[tuple[float, str, str, str], int] = {}
    for group, points in events.items():
        points.sort()
        level = 0
        for i, (at, step) in enumerate(points):
            level += step
            until = points[i + 1][0] if i + 1 < len(points) else at
            if level <= 0 or until <= at:
                continue
            minute = minute_of(at)
            while minute < until:  # every minute the level holds in, from this event to the next
                if minute in minutes:
                    key = (minute, *group)
                    peaks[key] = max(peaks.get(key, 0), level)
                minute += 60.0
    return peaks


def aggregate_minutes(batch: Sequence[Finished], later: Iterable[Finished] = ()) -> list[MinuteTotal]:
    """Per-minute totals of `batch` (whole minutes of rows, by completion). `later` are requests that
    completed after the batch's last minute but were in flight during it: they count towards its peak
    concurrency, not its requests."""
    totals: dict[tuple[float, str, str, str], list[float]] = {}
    for r in batch:
        key = (minute_of(r.completed), r.model, r.project, r.source)
        t = totals.setdefault(key, [0, 0, 0, 0, 0.0])
        t[0] += 1
        t[1] += r.status >= 400
        t[2] += r.tokens_in
        t[3] += r.tokens_out
        t[4] += r.cost
    peaks = _peaks([*batch, *later], {k[0] for k in totals})
    return [
        MinuteTotal(*key, int(t[0]), int(t[1]), int(t[2]), int(t[3]), t[4], peaks.get(key))
        for key, t in sorted(totals.items())
    ]


def merge_minutes(old: MinuteTotal, new: MinuteTotal) -> MinuteTotal:
    """One minute aggregated twice (a late row pruned after its minute was): counts add; the peak is the
    larger known one (the two parts' requests may have overlapped, so this is a lower bound)."""
    peaks = [p for p in (old.peak_concurrency, new.peak_concurrency) if p is not None]
    return MinuteTotal(
        *old.key,
        old.requests + new.requests,
        old.errors + new.errors,
        old.tokens_in + new.tokens_in,
        old.tokens_out + new.tokens_out,
        old.cost + new.cost,
        max(peaks) if peaks else None,
    )


def content_ttl(retention: ContentRetention | None) -> float | None:
    """How long a project may keep content, in seconds; None: it did not opt in (keep nothing)."""
    if retention is None or not retention.content:
        return None
    return parse_duration(retention.ttl)


def usage_cutoff(now: float, retention_s: float, budget_periods: Iterable[float]) -> float:
    """Before when per-request usage rows may be pruned: `retention_s` ago, but never inside the current
    window of a budget (a budget's spend is summed from those rows, so pruning into its window would lower
    what the tenant has spent)."""
    cutoff = now - retention_s
    for period in budget_periods:
        cutoff = min(cutoff, window_bounds(now, period)[0])
    return cutoff
