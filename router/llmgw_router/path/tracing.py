"""The request path's spans: one trace from the client through the router to the engine.

A request's root span (`llmgw.request`, SERVER) starts a trace of the router's own: a client's W3C
`traceparent` is kept as a link on it, never as its parent, so a client can neither choose the trace its
spans join nor force them to be sampled (L15, docs/security.md). Its children are `auth`, `limits`, `schedule` (the walk down the fallback chain and the pick, with the
endpoint, the picker and the deciding scorer), `queue` (the wait in the admission line, when there was one),
`upstream` (CLIENT: the engine call to its answer or, for a stream, to its first bytes; the engine is sent
this span's traceparent, which vLLM continues) and `stream` (first bytes to the end).

Spans whose work has no await inside a span of its own are recorded after the fact with their start and end
times, so the request path holds no context manager and sets no context variable: with tracing configured
the cost is the spans themselves; without, this module is never imported (service.py checks one attribute),
and a client's valid traceparent is passed to the engine as it came.

Only imported when an OTLP endpoint is configured (llmgw.adapters.tracing).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from llmgw_router.routing.forwarding import Picked
    from llmgw_router.upstream.proxy import ProxyResult

__all__ = ["RequestTrace", "RequestTracer"]

_PROPAGATOR = TraceContextTextMapPropagator()
_NEW_TRACE = Context()  # no parent: each request's root starts a trace (and its sampling decision)


class RequestTracer:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def begin(
        self, request_id: str, kind: str, traceparent: str | None, tracestate: str | None, started: float
    ) -> RequestTrace:
        offset = time.time_ns() - time.monotonic_ns()
        root = self.tracer.start_span(
            "llmgw.request",
            context=_NEW_TRACE,
            kind=SpanKind.SERVER,
            links=_client_link(traceparent, tracestate),
            start_time=offset + int(started * 1e9),
            attributes={"llmgw.request_id": request_id, "llmgw.endpoint_kind": kind},
        )
        return RequestTrace(self.tracer, root, offset)


def _client_link(traceparent: str | None, tracestate: str | None) -> list[trace.Link]:
    """The client's span, when it sent a valid traceparent, as a link: its trace stays findable from ours."""
    if not traceparent:
        return []
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    sent = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return [trace.Link(sent)] if sent.is_valid else []


class RequestTrace:
    """One request's spans. `span` records a finished step; `upstream_start`/`upstream_end` bracket an
    engine call; `end` closes whatever is open and the root."""

    __slots__ = ("_context", "_offset", "_tracer", "_upstream", "root")

    def __init__(self, tracer: Tracer, root: trace.Span, offset_ns: int) -> None:
        self._tracer = tracer
        self.root = root
        self._offset = offset_ns
        self._context = trace.set_span_in_context(root)
        self._upstream: trace.Span | None = None

    def _ns(self, monotonic_s: float) -> int:
        return self._offset + int(monotonic_s * 1e9)

    def span(
        self, name: str, began: float, ended: float | None = None, attributes: dict[str, Any] | None = None
    ) -> None:
        """A step of the request that ran from `began` to `ended` (time.monotonic(); now when None)."""
        done = ended if ended is not None else time.monotonic()
        s = self._tracer.start_span(
            name, context=self._context, start_time=self._ns(began), attributes=attributes
        )
        s.end(end_time=self._ns(done))

    def scheduled(self, began: float, picked: Picked) -> None:
        d = picked.decision
        attrs = {
            "llmgw.endpoint": picked.endpoint.id,
            "llmgw.model": picked.served,
            "llmgw.picker": d.picker,
            "llmgw.decided_by": d.winning_scorer,
            "llmgw.candidates": len(d.scores),
        }
        now = time.monotonic()
        self.span("schedule", began, now, attrs)
        if picked.queued_s:
            self.span("queue", now - picked.queued_s, now, {"llmgw.model": picked.served})

    def upstream_start(self, endpoint: str, model: str, url: str) -> str:
        """Open the engine call's span; the traceparent the engine is sent (its parent is this span)."""
        self._close_upstream("superseded by a retry")
        self._upstream = self._tracer.start_span(
            "upstream",
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes={"llmgw.endpoint": endpoint, "llmgw.model": model, "url.full": url},
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self._upstream))
        return carrier["traceparent"]

    def upstream_end(self, result: ProxyResult | None, failure: str | None = None) -> None:
        up, self._upstream = self._upstream, None
        if up is None:
            return
        if result is None:
            up.set_status(Status(StatusCode.ERROR, failure or "failed"))
            up.end()
            return
        up.set_attribute("http.response.status_code", result.status)
        if result.status >= 500 or result.upstream_failed:
            up.set_status(Status(StatusCode.ERROR, f"engine answered {result.status}"))
        first = result.first_byte_at
        if first is None:  # an answer sent whole: the call is the whole span
            up.end()
            return
        up.end(end_time=self._ns(first))
        attrs = {"llmgw.events": result.events, "llmgw.finished": result.finished}
        self.span("stream", first, None, attrs)

    def _close_upstream(self, why: str) -> None:
        if self._upstream is not None:
            self._upstream.set_status(Status(StatusCode.ERROR, why))
            self._upstream.end()
            self._upstream = None

    def end(self, status: int, code: str, model: str, served: str | None) -> None:
        self._close_upstream("the request ended before the engine answered")
        root = self.root
        root.set_attribute("http.response.status_code", status)
        root.set_attribute("llmgw.model", model)
        if served is not None:
            root.set_attribute("llmgw.served_by", served)
        if code:
            root.set_attribute("llmgw.error_code", code)
        if status >= 500:
            root.set_status(Status(StatusCode.ERROR, code or str(status)))
        root.end()
