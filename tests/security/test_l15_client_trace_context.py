"""L15: a client's `traceparent` neither forces its requests to be sampled nor joins the router's spans to a
trace the client chose. The router samples at the root (TraceIdRatioBased on its own trace id) and keeps
the client's span as a link on the root, never as its parent."""

from __future__ import annotations

import time

import pytest

from llmgw.adapters.tracing import otlp_tracer

pytest.importorskip("opentelemetry.sdk", reason="the llmgw[tracing] extra is not installed")

from llmgw_router.path.tracing import RequestTracer
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# Another request's trace, as a tenant who learned its id would send it, with the sampled flag set.
VICTIM_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
FORCED = f"00-{VICTIM_TRACE}-{CLIENT_SPAN}-01"


def _traced(sample: float, traceparent: str | None, requests: int = 1) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    tracer, shutdown = otlp_tracer(
        "llmgw-router", None, sample=sample, processor=SimpleSpanProcessor(exporter)
    )
    try:
        requests_tracer = RequestTracer(tracer)
        for n in range(requests):
            trace = requests_tracer.begin(f"req-{n}", "chat", traceparent, None, time.monotonic())
            trace.span("auth", time.monotonic())
            trace.end(200, "", "m", "m")
    finally:
        shutdown()
    return exporter


def test_l15_a_sampled_flag_does_not_force_sampling() -> None:
    exported = _traced(0.0, FORCED, requests=20)
    assert exported.get_finished_spans() == (), "a router sampling nothing exports nothing, flag or not"


def test_l15_the_clients_trace_is_a_link_not_the_parent() -> None:
    spans = _traced(1.0, FORCED).get_finished_spans()
    [root] = [s for s in spans if s.name == "llmgw.request"]
    assert root.parent is None, "the root starts a trace of the router's own"
    assert f"{root.context.trace_id:032x}" != VICTIM_TRACE
    assert {f"{s.context.trace_id:032x}" for s in spans} == {f"{root.context.trace_id:032x}"}
    [link] = root.links
    assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == (VICTIM_TRACE, CLIENT_SPAN)


def test_l15_a_malformed_traceparent_is_no_link() -> None:
    [root] = [s for s in _traced(1.0, "00-zz-yy-01").get_finished_spans() if s.name == "llmgw.request"]
    assert root.parent is None and list(root.links) == []
