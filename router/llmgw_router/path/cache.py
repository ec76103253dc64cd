"""The response cache on the request path: look up after the limits, answer a hit (whole, or replayed as a
stream with a fresh id and created), store a miss's complete answer, mark every answer `x-llmgw-cache`.

The decisions (key, directives, LRU) are response_cache.py's; this is the shell around them. A hit is charged
`hit_charge` of the stored answer's tokens (and so of its cost) and recorded with `decision: {"cache": "hit",
"age_s": ...}` in its usage row; it takes its place in the project's limits like any request, and never
reaches the scheduler or an engine.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from llmgw.core.config.models import ProjectSpec
from llmgw_router.decisions.fields import DROPPED_HEADER
from llmgw_router.decisions.response_cache import (
    CacheEntry,
    Directive,
    ProjectCache,
    ResponseCache,
    cache_key,
    directive,
)
from llmgw_router.fleet.tag_metrics import Count
from llmgw_router.path.accounting import Call
from llmgw_router.server import sse
from llmgw_router.server.exchange import Exchange, HttpReply, WrappedExchange
from llmgw_router.upstream.proxy import ProxyResult

__all__ = ["HEADER", "CachePath", "CachedRequest", "RecordingExchange"]

HEADER = "x-llmgw-cache"
_PREFIX = "llmgw_router_cache_"


@dataclass(slots=True)
class CachedRequest:
    """One request the cache may answer or keep."""

    cache: ProjectCache
    key: str
    directive: Directive
    model: str
    stream: bool
    exchange: RecordingExchange  # what the request path writes to, so a stream can be kept
    hit: CacheEntry | None = None


class RecordingExchange(WrappedExchange):
    """The client's exchange, with `x-llmgw-cache` on the answer's head and a stream's bytes kept (up to
    `limit`; past it nothing more is kept and the stream is not stored)."""

    def __init__(self, inner: Exchange, mark: str, limit: int | None) -> None:
        super().__init__(inner)
        self.mark = mark
        self._limit = limit  # None: keep nothing
        self._chunks: list[bytes] = []
        self._kept = 0
        self.overflowed = limit is None
        self.ended = False

    def respond(self, reply: HttpReply) -> None:
        reply.headers[HEADER] = self.mark
        self.inner.respond(reply)

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        self.inner.start_stream(status, {**headers, HEADER: self.mark})

    def _keep(self, chunk: bytes) -> None:
        if self.overflowed or not chunk:
            return
        self._kept += len(chunk)
        if self._limit is not None and self._kept > self._limit:
            self.overflowed, self._chunks = True, []
            return
        self._chunks.append(chunk)

    async def write(self, chunk: bytes, limit_s: float) -> None:
        self._keep(chunk)
        await self.inner.write(chunk, limit_s)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        self._keep(last)
        await self.inner.write_eof(limit_s, last)
        self.ended = True

    def kept(self) -> bytes | None:
        """The whole stream as the client got it, or None when it was not kept whole."""
        return None if self.overflowed or not self.ended else b"".join(self._chunks)


class CachePath:
    """The router's response cache and its metrics."""

    def __init__(
        self, registry: CollectorRegistry, count: Count, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = ResponseCache(clock)
        self._count = count  # RouterMetrics.count: a plain dict, added to the series when they are collected
        self.requests = Counter(
            _PREFIX + "requests",
            "Requests the response cache saw, by model and result (hit, miss, refresh: no-cache, bypass: no-store)",
            ["model", "result"],
            registry=registry,
        )
        registry.register(_CacheCollector(self.store))

    def configure(self, projects: Mapping[str, ProjectSpec]) -> None:
        self.store.configure(projects)

    def begin(
        self,
        exchange: Exchange,
        kind: str,
        body: dict[str, Any],
        project: str | None,
        model: str,
        adapter: str | None = None,
    ) -> CachedRequest | None:
        """The cache's part in this request (None: the project keeps no cache of this model, or a Responses
        turn, whose answer is rebuilt from stored state); a hit is in `.hit`."""
        cache = self.store.for_request(project, model)
        if cache is None or project is None or not exchange.surface.cacheable:
            return None
        said = directive(exchange.headers.get("cache-control"))
        key = cache_key(project, kind, adapter or model, body)  # an adapter answers otherwise than its base
        hit = cache.get(key, self.store.clock()) if said == "use" else None
        result = "hit" if hit is not None else {"use": "miss", "refresh": "refresh", "bypass": "bypass"}[said]
        self._count(self.requests, (model, result), 1.0)
        limit = None if said == "bypass" else cache.spec.max_entry_bytes
        recorder = RecordingExchange(exchange, result, limit)
        return CachedRequest(cache, key, said, model, body.get("stream") is True, recorder, hit)

    async def serve(self, cached: CachedRequest, call: Call, write_timeout: float) -> HttpReply | None:
        """Answer from the cache: the stored body, or the stored stream replayed, each with a fresh id and
        created; the call charged `hit_charge` of the stored usage."""
        entry = cached.hit
        assert entry is not None, "serve answers hits only"
        now = self.store.clock()
        fraction = cached.cache.spec.hit_charge
        call.served = cached.model
        call.cache = {"cache": "hit", "age_s": round(now - entry.stored_at, 3)}
        call.result = ProxyResult(
            None,
            200,
            prompt_tokens=round((entry.prompt_tokens or 0) * fraction),
            completion_tokens=round((entry.completion_tokens or 0) * fraction),
            finished=True,
        )
        headers = {
            "x-request-id": call.request_id,
            "x-llmgw-model": cached.model,
            HEADER: "hit",
            "Age": str(int(now - entry.stored_at)),
        }
        if call.lease is not None and call.lease.admission is not None:
            headers.update(call.lease.admission.headers)
        if entry.dropped_fields:
            headers[DROPPED_HEADER] = entry.dropped_fields
        fresh_id, created = f"{random.getrandbits(128):032x}", int(now)
        if not entry.stream:
            headers["Content-Type"] = entry.content_type
            return HttpReply(200, _refreshed_whole(entry.body, fresh_id, created), headers)
        exchange = cached.exchange.inner  # a hit is marked by the headers above, not by the recorder
        exchange.start_stream(
            200, {"Content-Type": entry.content_type, "Cache-Control": "no-cache", **headers}
        )
        call.result.first_byte_at = time.monotonic()
        if call.ending is not None:  # its slots are free before the client can read the answer's end
            call.ending()
        await exchange.write_eof(write_timeout, _refreshed_stream(entry.body, fresh_id, created))
        call.result.events = entry.events
        return None

    def finish(self, cached: CachedRequest, call: Call, reply: HttpReply | None) -> HttpReply | None:
        """After a miss (or refresh) went to an engine: keep its complete answer; mark a whole one."""
        if reply is not None:
            reply.headers[HEADER] = cached.exchange.mark
        if cached.directive == "bypass" or call.served != cached.model or call.canary:
            return reply  # not kept; a fallback's answer (not the model asked for); a canary's (on trial)
        result = call.result
        if result is None or result.status != 200 or result.upstream_failed or result.client_gone:
            return reply
        now = self.store.clock()
        if reply is not None:
            body, content_type, stream = (
                reply.body,
                reply.headers.get("Content-Type", "application/json"),
                False,
            )
        else:
            kept = cached.exchange.kept()
            if kept is None or not result.finished:
                return reply
            body, content_type, stream = kept, "text/event-stream", True
        dropped = reply.headers.get(DROPPED_HEADER) if reply is not None else None
        entry = CacheEntry(
            stream=stream,
            body=body,
            content_type=content_type,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            events=result.events,
            stored_at=now,
            expires_at=now + cached.cache.ttl,
            dropped_fields=dropped,
        )
        cached.cache.put(cached.key, entry)
        return reply


def _new_id(old: Any, fresh: str) -> str:
    """`chatcmpl-<fresh>` for `chatcmpl-<old>`: the stored answer's id prefix kept, the rest new."""
    prefix = old.rpartition("-")[0] + "-" if isinstance(old, str) and "-" in old else ""
    return prefix + fresh


def _refreshed_whole(body: bytes, fresh: str, created: int) -> bytes:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(obj, dict):
        return body
    if "id" in obj:
        obj["id"] = _new_id(obj["id"], fresh)
    if "created" in obj:
        obj["created"] = created
    return orjson.dumps(obj)


def _refreshed_stream(stream: bytes, fresh: str, created: int) -> bytes:
    """The stored SSE stream with each data event's id and created replaced (one id for the whole stream)."""
    out: list[bytes] = []
    for raw in sse.split(stream):
        event = sse.parse(raw)
        try:
            obj = orjson.loads(event.data) if event.data is not None and not event.done else None
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            out.append(raw)
            continue
        if "id" in obj:
            obj["id"] = _new_id(obj["id"], fresh)
        if "created" in obj:
            obj["created"] = created
        out.append(sse.format_event(orjson.dumps(obj), event.name, event.id))
    return b"".join(out)


class _CacheCollector(Collector):
    def __init__(self, store: ResponseCache) -> None:
        self._store = store

    def collect(self) -> Iterator[Any]:
        projects = self._store.projects.values()
        size = GaugeMetricFamily(_PREFIX + "bytes", "Bytes the response cache holds (answers and overhead)")
        size.add_metric([], float(sum(c.bytes for c in projects)))
        count = GaugeMetricFamily(_PREFIX + "entries", "Answers the response cache holds")
        count.add_metric([], float(sum(len(c.entries) for c in projects)))
        evicted = CounterMetricFamily(
            _PREFIX + "evictions", "Answers dropped to keep a project's cache under its max_bytes"
        )
        evicted.add_metric([], float(self._store.evictions))
        yield from (size, count, evicted)
