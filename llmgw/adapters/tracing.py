"""OpenTelemetry for llmgw's processes: a tracer exporting over OTLP/HTTP, built only when an endpoint is
configured (`--otlp-endpoint URL`, else `OTEL_EXPORTER_OTLP_ENDPOINT`).

Nothing imports opentelemetry unless `otlp_tracer` is called: a process without an endpoint never loads it
(the `llmgw[tracing]` extra may not even be installed), and its request path checks one attribute for None.
The SDK's BatchSpanProcessor exports from a thread of its own, off the event loop; a collector that is down
costs dropped spans (the SDK logs them), never a slower request.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmgw.core.errors import LlmgwError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.trace import Tracer

__all__ = ["ENDPOINT_ENV", "TracingUnavailable", "configured_endpoint", "otlp_tracer", "traces_url"]

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"


class TracingUnavailable(LlmgwError, ValueError):
    """An OTLP endpoint is configured but the tracing extra is not installed, or the ratio is out of range."""


def configured_endpoint(flag: str | None) -> str | None:
    """The flag's endpoint, else the standard environment variable's; None: tracing is off."""
    return flag or os.environ.get(ENDPOINT_ENV) or None


def traces_url(endpoint: str) -> str:
    """OTLP/HTTP's traces path under a collector's base address (`http://collector:4318`), unless given."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


def otlp_tracer(
    service: str,
    endpoint: str | None,
    *,
    sample: float = 1.0,
    processor: SpanProcessor | None = None,
) -> tuple[Tracer, Callable[[], None]]:
    """A tracer for `service` and the call that flushes and stops it. Spans go to `endpoint` over OTLP/HTTP
    (protobuf), or to `processor` (tests: the SDK's in-memory exporter). Every trace is kept with
    probability `sample`, decided at its root from its own trace id: a caller's sampled flag decides nothing
    (L15, docs/security.md), so a client cannot make the router export every one of its requests."""
    if not 0.0 <= sample <= 1.0:
        raise TracingUnavailable(f"trace sample ratio {sample} must be from 0 to 1")
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
    except ImportError as exc:
        raise TracingUnavailable(
            f"tracing to {endpoint} needs OpenTelemetry: pip install 'llmgw[tracing]' ({exc.name} is missing)"
        ) from None
    provider = TracerProvider(
        resource=Resource.create({"service.name": service}),
        sampler=TraceIdRatioBased(sample),
    )
    if processor is None:
        if endpoint is None:
            raise TracingUnavailable("otlp_tracer needs an endpoint or a span processor")
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise TracingUnavailable(
                f"tracing to {endpoint} needs the OTLP exporter: pip install 'llmgw[tracing]' ({exc.name})"
            ) from None
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint)))
    provider.add_span_processor(processor)
    return provider.get_tracer("llmgw"), provider.shutdown
