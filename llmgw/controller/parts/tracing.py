"""The commit path's spans: one trace per revision, from its arrival to its replicas ready.

`revision` (the root: the revision offered, applied or refused) has a child `validate` (the pipeline
`llmgw validate` runs); every reconcile pass that acts while that revision is in force is a `reconcile` span
under it, each replica it starts a `start` span under that (the start command to the agent's answer), and
the replica's `ready` span runs from the start command to the pass that first sees it ready. So a trace shows
where a commit's time went: validation, waiting for a pass, the agents, the engines loading.

Only imported when an OTLP endpoint is configured (llmgw.adapters.tracing); `Controller.commit_tracer` is
None otherwise and every hook is one `is not None` test.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from opentelemetry import context as otel_context, trace
from opentelemetry.trace import Status, StatusCode, Tracer

__all__ = ["CommitTracer"]

_PENDING_MAX = 1000  # replicas started and not yet ready that keep their span context (oldest dropped)


class CommitTracer:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self._revision: otel_context.Context | None = None
        self._reconcile: otel_context.Context | None = None
        self._starting: dict[str, trace.Span] = {}
        self._waiting: OrderedDict[str, tuple[otel_context.Context, int]] = OrderedDict()

    def revision(
        self, revision: str, source: str, began_ns: int, validated_ns: int, errors: list[str] | None
    ) -> None:
        """A revision was offered at `began_ns` and validated by `validated_ns` (time.time_ns()): refused with
        `errors`, or applied (None), after which the passes it causes are traced under it."""
        attrs = {"llmgw.revision": revision, "llmgw.source": source}
        root = self.tracer.start_span(
            "revision", context=otel_context.Context(), start_time=began_ns, attributes=attrs
        )
        ctx = trace.set_span_in_context(root)
        check = self.tracer.start_span("validate", context=ctx, start_time=began_ns)
        if errors is not None:
            check.set_attribute("llmgw.errors", len(errors))
            check.set_status(Status(StatusCode.ERROR, errors[0] if errors else "refused"))
            root.set_status(Status(StatusCode.ERROR, "refused"))
        check.end(end_time=validated_ns)
        root.end(end_time=validated_ns)
        if errors is None:
            self._revision = ctx

    def reconcile_begin(self, actions: list[str]) -> trace.Span:
        span = self.tracer.start_span(
            "reconcile",
            context=self._revision or otel_context.Context(),
            attributes={"llmgw.actions": actions},
        )
        self._reconcile = trace.set_span_in_context(span)
        return span

    def reconcile_end(self, span: trace.Span) -> None:
        span.end()
        self._reconcile = None

    def starting(self, replica_id: str, model: str, nodes: list[str]) -> None:
        parent = self._reconcile or self._revision or otel_context.Context()
        attrs = {"llmgw.replica": replica_id, "llmgw.model": model, "llmgw.nodes": nodes}
        span = self.tracer.start_span("start", context=parent, attributes=attrs)
        self._starting[replica_id] = span
        # Kept from the start command, not its answer: an agent may answer only once the engine is ready, and
        # the pass that sees it ready can come first.
        self._waiting[replica_id] = (trace.set_span_in_context(span), time.time_ns())
        while len(self._waiting) > _PENDING_MAX:
            self._waiting.popitem(last=False)

    def started(self, replica_id: str, error: str) -> None:
        """The agent answered the start command: accepted (`error` empty) or refused."""
        span = self._starting.pop(replica_id, None)
        if span is None:
            return
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
            self._waiting.pop(replica_id, None)
        span.end()

    def ready(self, replica_id: str) -> None:
        found = self._waiting.pop(replica_id, None)
        if found is not None:
            parent, since = found
            attrs = {"llmgw.replica": replica_id}
            self.tracer.start_span("ready", context=parent, start_time=since, attributes=attrs).end()
