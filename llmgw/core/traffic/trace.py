"""A traffic trace: the shapes of recorded requests, never their content (issue 21).

One format, written by `llmgw traffic export`, read by `llmgw traffic import` and `llmgw plan --simulate`, and
written by hand or by a generator for synthetic traces. JSON lines:

- line 1, the header: `{"llmgw_trace": 1, "start": <unix seconds>, "duration_s": <float>, "source": "<text>"}`;
- every other line, one request, in arrival order:
  `{"t": <seconds after start>, "model": "...", "project": "...", "prompt_tokens": N, "completion_tokens": N,
  "prefix": "<hex>" | null, "stream": true | false, "ttft_ms": <float> | null, "duration_ms": <float>,
  "status": <HTTP status>}`.

`prefix` is a salted hash of the request's session or prefix key (null: the request had none); `ttft_ms` is
null for an answer sent whole or one that never began (unknown is not zero). A line that does not parse is
skipped and named with its line number; the rest of the trace is kept.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

from llmgw.core.errors import LlmgwError

__all__ = [
    "TRACE_VERSION",
    "Trace",
    "TraceError",
    "TraceHeader",
    "TracedRequest",
    "format_trace",
    "parse_request",
    "parse_trace",
]

TRACE_VERSION = 1


@dataclass(frozen=True)
class TraceHeader:
    start: float  # unix seconds of the first possible arrival
    duration_s: float
    source: str = ""


@dataclass(frozen=True)
class TracedRequest:
    t: float  # seconds after the header's start
    model: str
    project: str
    prompt_tokens: int
    completion_tokens: int
    prefix: str | None = None
    stream: bool = False
    ttft_ms: float | None = None
    duration_ms: float = 0.0
    status: int = 200


@dataclass(frozen=True)
class Trace:
    header: TraceHeader
    requests: tuple[TracedRequest, ...]
    skipped: tuple[str, ...] = field(default=())  # "line N: what was wrong", one per line not read


class TraceError(LlmgwError, ValueError):
    """The trace cannot be read at all (no header, another version)."""


def format_trace(header: TraceHeader, requests: Iterable[TracedRequest]) -> Iterator[str]:
    """The trace's lines, each without its newline."""
    yield json.dumps({"llmgw_trace": TRACE_VERSION, **asdict(header)}, separators=(",", ":"))
    for r in requests:
        yield json.dumps(asdict(r), separators=(",", ":"))


def _number(raw: dict[str, object], name: str, *, optional: bool = False) -> float | None:
    value = raw.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a number at or above 0 (got {value!r})")
    return float(value)


def _count(raw: dict[str, object], name: str) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number at or above 0 (got {value!r})")
    return value


def _text(raw: dict[str, object], name: str, *, optional: bool = False) -> str | None:
    value = raw.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string (got {value!r})")
    return value


def parse_request(raw: object) -> TracedRequest:
    if not isinstance(raw, dict):
        raise ValueError(f"a request is a JSON object (got {type(raw).__name__})")
    status = _count(raw, "status") if "status" in raw else 200
    stream = raw.get("stream", False)
    if not isinstance(stream, bool):
        raise ValueError(f"stream must be true or false (got {stream!r})")
    return TracedRequest(
        t=_number(raw, "t") or 0.0,
        model=_text(raw, "model") or "",
        project=_text(raw, "project") or "",
        prompt_tokens=_count(raw, "prompt_tokens"),
        completion_tokens=_count(raw, "completion_tokens"),
        prefix=_text(raw, "prefix", optional=True),
        stream=stream,
        ttft_ms=_number(raw, "ttft_ms", optional=True),
        duration_ms=_number(raw, "duration_ms", optional=True) or 0.0,
        status=status,
    )


def parse_trace(lines: Iterable[str]) -> Trace:
    """Read a trace; raises TraceError when its header is missing or of another version."""
    it = enumerate(lines, start=1)
    first = next((line for _, line in it if line.strip()), None)
    if first is None:
        raise TraceError('the trace is empty: line 1 must be its header {"llmgw_trace": 1, ...}')
    try:
        head = json.loads(first)
    except json.JSONDecodeError as exc:
        raise TraceError(f"line 1: the header is not JSON ({exc.msg})") from None
    if not isinstance(head, dict) or head.get("llmgw_trace") != TRACE_VERSION:
        got = head.get("llmgw_trace") if isinstance(head, dict) else head
        raise TraceError(f"line 1: not an llmgw trace of version {TRACE_VERSION} (llmgw_trace is {got!r})")
    try:
        header = TraceHeader(
            start=_number(head, "start") or 0.0,
            duration_s=_number(head, "duration_s") or 0.0,
            source=str(head.get("source", "")),
        )
    except ValueError as exc:
        raise TraceError(f"line 1: {exc}") from None
    requests: list[TracedRequest] = []
    skipped: list[str] = []
    for number, line in it:
        if not line.strip():
            continue
        try:
            requests.append(parse_request(json.loads(line)))
        except json.JSONDecodeError as exc:
            skipped.append(f"line {number}: not JSON ({exc.msg})")
        except ValueError as exc:
            skipped.append(f"line {number}: {exc}")
    requests.sort(key=lambda r: r.t)
    return Trace(header, tuple(requests), tuple(skipped))
