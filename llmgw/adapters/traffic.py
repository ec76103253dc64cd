"""`llmgw traffic export` and `import`: usage rows as a trace (llmgw.core.traffic.trace) and a trace back as rows.

Export reads the store page by page in completion order and writes requests in arrival order
(arrival = completion - duration), holding back only the requests that may still be overtaken: a row is
written once the page reader is past its arrival by `REORDER_S`, so memory is bounded by that window, not by
the trace. Import marks every row `router_id = import:<source>` and gives it an id made from the trace's
digest and line, so importing the same trace twice adds nothing the second time.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from llmgw.core.traffic.recorded import IMPORT_PREFIX
from llmgw.core.traffic.trace import Trace, TracedRequest, TraceHeader, format_trace
from llmgw.store import Store, UsageRecord

__all__ = ["REORDER_S", "ImportResult", "export_lines", "import_trace", "traced", "usage_row"]

# A request that ran longer than this may be written after one that arrived later than it; a reader sorts
# by `t` anyway (llmgw.core.traffic.trace.parse_trace), so such a trace still reads right.
REORDER_S = 3600.0
_PAGE = 2000
_IMPORT_BATCH = 500


def traced(rec: UsageRecord, start: float) -> TracedRequest:
    """A usage row as a trace line. A row from before migration 0009 does not know whether it streamed: a
    time to first token is recorded only for a streamed answer, so that stands in for it."""
    duration_ms = max(rec.latency_ms, 0.0)
    stream = rec.stream if rec.stream is not None else rec.ttft_ms is not None
    return TracedRequest(
        t=max(rec.time - duration_ms / 1000.0 - start, 0.0),
        model=rec.model,
        project=rec.project,
        prompt_tokens=max(rec.tokens_in, 0),
        completion_tokens=max(rec.tokens_out, 0),
        prefix=rec.prefix,
        stream=stream,
        ttft_ms=rec.ttft_ms,
        duration_ms=duration_ms,
        status=rec.status,
    )


async def _rows(
    store: Store, since: float, until: float, model: str | None, project: str | None
) -> AsyncIterator[UsageRecord]:
    after: tuple[float, str] | None = None
    while True:
        page = await store.usage_page(since, until, after, model=model, project=project, limit=_PAGE)
        for rec in page:
            yield rec
        if len(page) < _PAGE:
            return
        after = (page[-1].time, page[-1].id)


async def export_lines(
    store: Store, since: float, until: float, *, model: str | None = None, project: str | None = None
) -> AsyncIterator[str]:
    """The trace of requests completed in [since, until): its header, then one line per request. The header's
    start is `since`; a request that arrived before it (completed after) has t = 0."""
    header = TraceHeader(start=since, duration_s=max(until - since, 0.0), source=store.dsn.redacted())
    lines = format_trace(header, ())
    yield next(lines)
    held: list[tuple[float, str, TracedRequest]] = []  # (arrival, id, line) not yet safe to write
    async for rec in _rows(store, since, until, model, project):
        req = traced(rec, since)
        heapq.heappush(held, (req.t, rec.id, req))
        while held and held[0][0] < rec.time - since - REORDER_S:
            yield _line(heapq.heappop(held)[2])
    while held:
        yield _line(heapq.heappop(held)[2])


def _line(req: TracedRequest) -> str:
    return list(format_trace(TraceHeader(0.0, 0.0), (req,)))[1]


def usage_row(req: TracedRequest, header: TraceHeader, source: str, row_id: str, number: int) -> UsageRecord:
    """A trace line as a usage row: completed at arrival + duration, no key, team, org or cost (not in a
    trace), marked as imported from `source`."""
    return UsageRecord(
        time=header.start + req.t + req.duration_ms / 1000.0,
        request_id=f"{IMPORT_PREFIX}{source}:{number}",
        project=req.project,
        model=req.model,
        status=req.status,
        tokens_in=req.prompt_tokens,
        tokens_out=req.completion_tokens,
        latency_ms=req.duration_ms,
        router_id=IMPORT_PREFIX + source,
        id=row_id,
        ttft_ms=req.ttft_ms,
        stream=req.stream,
        prefix=req.prefix,
    )


@dataclass(frozen=True)
class ImportResult:
    imported: int  # rows written (a row already there from an earlier import of the same trace is not)
    read: int  # requests read from the trace
    skipped: tuple[str, ...]  # "line N: what was wrong", from the trace's reader


def _row_ids(digest: str, count: int) -> Iterable[str]:
    for n in range(count):
        yield hashlib.blake2b(f"{digest}\0{n}".encode(), digest_size=16).hexdigest()


async def import_trace(store: Store, trace: Trace, source: str, digest: str) -> ImportResult:
    """Write a trace's requests as usage rows marked `import:<source>`; `digest` identifies the trace's text,
    so the same trace imported again is kept once."""
    ids = _row_ids(digest, len(trace.requests))
    rows = [
        usage_row(req, trace.header, source, row_id, number)
        for number, (req, row_id) in enumerate(zip(trace.requests, ids, strict=True))
    ]
    imported = 0
    for i in range(0, len(rows), _IMPORT_BATCH):
        batch = rows[i : i + _IMPORT_BATCH]
        imported += len(batch) - await store.usage_ids_present([r.id for r in batch])
        await store.insert_usage(batch)
    return ImportResult(imported, len(trace.requests), trace.skipped)
