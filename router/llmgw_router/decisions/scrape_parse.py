"""Read an engine's Prometheus page with that engine's metric names. Pure: text in, a value out.

Running and waiting are mandatory: an engine that says neither what it is doing nor what is queued cannot be
scheduled against. KV usage is optional (llama.cpp publishes none) and unset means "not published"; a name
that is set but absent from the page is a contract violation, reported as a value beside the sample so a
typo in a mapping is seen rather than silently read as zero. Nothing here raises on bad input: an HTML page
or garbage is a `ScrapeError` value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["MetricNames", "Sample", "ScrapeError", "ScrapeResult", "parse_metrics"]


@dataclass(frozen=True)
class MetricNames:
    """The sample names an engine serves (without labels). `kv_alternatives` are older names tried in order."""

    running: str
    waiting: str
    kv_usage: str | None = None
    kv_alternatives: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sample:
    """One scrape's reading. `kv_usage` None means unknown (unmapped or missing), never zero.

    `missing` lists mapped names the page lacks: a contract violation when non-empty.
    """

    running: float
    waiting: float
    kv_usage: float | None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScrapeError:
    """The page could not be read as engine metrics; `missing` is set when mandatory names were absent."""

    reason: str
    missing: tuple[str, ...] = ()


ScrapeResult = Sample | ScrapeError

# name{labels} value [timestamp]; label values may contain escaped quotes and spaces.
_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[^\"}]|\"(?:[^\"\\]|\\.)*\")*)\})?"
    r"\s+(?P<value>\S+)(?:\s+-?[0-9]+)?\s*$"
)


def _value(text: str) -> float | None:
    try:
        return float(text)  # accepts NaN, +Inf, -Inf as Prometheus writes them
    except ValueError:
        return None


def _collect(text: str, wanted: frozenset[str]) -> dict[str, list[float]] | ScrapeError:
    found: dict[str, list[float]] = {}
    samples = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        value = _value(match.group("value")) if match else None
        if match is None or value is None:
            return ScrapeError(f"line {number} is not Prometheus text: {line[:80]!r}")
        samples += 1
        name = match.group("name")
        if name in wanted:
            found.setdefault(name, []).append(value)
    if samples == 0:
        return ScrapeError("the page holds no Prometheus samples")
    return found


def parse_metrics(text: str, names: MetricNames) -> ScrapeResult:
    """Read running, waiting and KV usage from a Prometheus text page.

    Several series of one name (per engine rank or label set) are summed for running and waiting, and the
    largest is taken for KV usage: the fullest cache is the one that refuses the next sequence.
    """
    head = text.lstrip()[:200].lower()
    if head.startswith("<") or "<html" in head:
        return ScrapeError("the page is HTML, not Prometheus text (wrong metrics path?)")
    kv_names = (names.kv_usage, *names.kv_alternatives) if names.kv_usage else ()
    wanted = frozenset((names.running, names.waiting, *kv_names))
    found = _collect(text, wanted)
    if isinstance(found, ScrapeError):
        return found
    missing_mandatory = tuple(n for n in (names.running, names.waiting) if n not in found)
    if missing_mandatory:
        return ScrapeError(
            f"mandatory metric(s) {', '.join(missing_mandatory)} not on the page", missing_mandatory
        )
    running = math.fsum(found[names.running])
    waiting = math.fsum(found[names.waiting])
    if math.isnan(running) or math.isnan(waiting):
        return ScrapeError("running or waiting is NaN")
    kv: float | None = None
    missing: tuple[str, ...] = ()
    if names.kv_usage is not None:
        present = next((n for n in kv_names if n in found), None)
        if present is None:
            missing = (names.kv_usage,)
        else:
            values = [v for v in found[present] if not math.isnan(v)]
            kv = min(max(values), 1.0) if values else None
    return Sample(running=max(running, 0.0), waiting=max(waiting, 0.0), kv_usage=kv, missing=missing)
