"""The request as one endpoint is sent it (`UpstreamCall`): its URL, body and headers, and the headers its
answer goes back with. Built per attempt: a retry on another endpoint, or another engine, is sent otherwise.

The body is the client's, with the model named as the endpoint knows it, the cap a request reserved when it
named none, usage asked for on a stream (and stripped again), the fields the engine does not take dropped (and
named in the answer's header), a LoRA adapter's name rewritten.
"""

from __future__ import annotations

from typing import Any, Literal

from llmgw_router.decisions.federation import HOP_HEADER, next_hops
from llmgw_router.decisions.fields import DROPPED_HEADER, plan_fields
from llmgw_router.decisions.media.forms import encode_form, wav_seconds
from llmgw_router.decisions.rules import NO_COMPLETION, payload, sent_cap
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.path.accounting import Call
from llmgw_router.path.lora import Adapters
from llmgw_router.routing.forwarding import Picked
from llmgw_router.surfaces.responses.translate import PASSED_THROUGH_FIELDS
from llmgw_router.upstream.proxy import UpstreamCall

__all__ = ["Kind", "upstream_call"]

Kind = Literal[
    "chat",
    "completions",
    "embeddings",
    "responses",
    "rerank",
    "score",
    "images",
    "transcriptions",
    "translations",
]
_PATHS: dict[str, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
    "responses": "/responses",
    "rerank": "/rerank",
    "score": "/score",
    "images": "/images/generations",
    "transcriptions": "/audio/transcriptions",
    "translations": "/audio/translations",
}
# An API surface sent as it came to an engine that serves it (vLLM's /v1/responses): the fields it accepts.
_SURFACE_FIELDS: dict[str, frozenset[str]] = {"responses": PASSED_THROUGH_FIELDS}


def upstream_call(
    kind: Kind,
    table: RoutingTable,
    canonical: str,
    raw: bytes,
    body: dict[str, Any],
    call: Call,
    picked: Picked,
    debug: bool,
    attempt: int,
    adapters: Adapters,
) -> UpstreamCall:
    """The request as this endpoint is sent it, and the headers its answer goes back with."""
    ep, served = picked.endpoint, picked.served
    client_stream = body.get("stream") is True and kind not in NO_COMPLETION
    stream_opts = body.get("stream_options")
    # The Responses API has no stream_options: its usage is in its last event, never to be stripped.
    client_usage = kind == "responses" or (
        isinstance(stream_opts, dict) and stream_opts.get("include_usage") is True
    )
    reply = _reply_headers(call, picked, canonical, debug)
    # A request that names no max_tokens is sent the cap it reserved: the reservation bounds the spend.
    cap = (
        sent_cap(table.models.get(served), call.sizing, ep.is_provider)
        if kind not in NO_COMPLETION and kind != "responses"  # max_tokens is not a Responses field
        else None
    )
    # A stream is always asked for its usage (and the extra chunk stripped again), so it can be charged.
    want_usage = client_stream and not client_usage
    ask_usage = (stream_opts if isinstance(stream_opts, dict) else {}) if want_usage else None
    fields = None
    if not ep.is_provider:
        project = call.principal.project if call.principal else None
        allowed = table.snapshot.router.allowed_request_fields
        surface = _SURFACE_FIELDS.get(kind)
        fields = plan_fields(ep.spec.engine, kind, body, allowed, project, ep.spec.api_key, surface)
        # Never silently: the client learns which of its fields the engine did not get.
        if fields is not None and fields.drop:
            reply[DROPPED_HEADER] = ",".join(fields.drop)
    if (
        call.form is not None
    ):  # a speech request's multipart form, its model renamed (decisions/media/forms.py)
        return _form_call(kind, call, picked, reply, attempt, table.snapshot.cluster)
    sent = payload(raw, body, ep.upstream_model or served, cap, ask_usage, fields)
    if call.adapter is not None or ep.spec.adapters:
        sent = adapters.rewrite(sent, ep, call.adapter, table.snapshot.adapters.get(call.adapter or ""))
    url = ep.api_base + _PATHS[kind]
    return UpstreamCall(
        url=url,
        payload=sent,
        headers=_headers(call, picked, url, table.snapshot.cluster),
        stream=client_stream,
        strip_usage_chunk=want_usage,
        rewrite_model=served if ep.is_provider else None,
        reply_headers=reply,
        retry_on_5xx=attempt == 0,
    )


def _form_call(
    kind: Kind, call: Call, picked: Picked, reply: dict[str, str], attempt: int, cluster: str | None
) -> UpstreamCall:
    """A speech request as the endpoint is sent it: the form written again, its answer passed on as it comes
    (JSON, or text, srt, vtt), the WAV's length kept for a bill the engine does not report."""
    assert call.form is not None
    ep = picked.endpoint
    sent, content_type = encode_form(call.form, ep.upstream_model or picked.served)
    url = ep.api_base + _PATHS[kind]
    headers = {**_headers(call, picked, url, cluster), "Content-Type": content_type}
    return UpstreamCall(
        url, sent, headers, False, False, None, reply, attempt == 0, True, wav_seconds(call.form)
    )


def _reply_headers(call: Call, picked: Picked, canonical: str, debug: bool) -> dict[str, str]:
    """What the answer goes back with: the request id, the model that served it, the limits' headers."""
    reply = {"x-request-id": call.request_id, "x-llmgw-model": picked.served}
    if call.lease is not None and call.lease.admission is not None:
        reply.update(call.lease.admission.headers)  # x-ratelimit-* on every answer, as OpenAI does
    if picked.served != canonical:
        reply["x-llmgw-fallback"] = picked.served
    if debug:
        reply["x-llmgw-decision"] = picked.decision.rationale()
    return reply


def _headers(call: Call, picked: Picked, url: str, cluster: str | None) -> dict[str, str]:
    """The request's headers to the endpoint: its key, the request id, the trace context (an engine's only),
    the clusters it passed through (a peer's only)."""
    ep = picked.endpoint
    key = ep.provider_key if ep.is_provider else ep.spec.api_key
    headers = {"Content-Type": "application/json", "x-request-id": call.request_id}
    if ep.spec.engine == "peer":
        headers[HOP_HEADER] = next_hops(call.hops, cluster)
    # W3C trace context for the engine (vLLM continues it): the router's upstream span, or the client's.
    traceparent = call.trace.upstream_start(ep.id, picked.served, url) if call.trace else call.traceparent
    if traceparent is not None and not ep.is_provider:  # an outside provider learns no trace ids
        headers["traceparent"] = traceparent
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers
