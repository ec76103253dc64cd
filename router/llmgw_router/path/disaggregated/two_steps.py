"""A disaggregated model's request, served in two steps: prefill on its prefill pool, decode on its decode pool.

The steps are vLLM's P/D protocol (decisions/disagg.py): the prefill replica is asked for one token, whole, and
to keep the prompt's KV cache for a remote decode; its answer's `kv_transfer_params` go with the request to a
decode replica, which streams the answer to the client. The decode replica is the scheduler's choice among the
pool (load), first among the replicas on the host the prefill's answer says its KV is on.

One usage row: the decode's answer is the request's (its usage counts the prompt once and the tokens it made;
the prefill's one token is the router's own and not charged), recorded under the model the client asked for.
A step that fails before the client saw a byte (a replica unreachable, gone, answering 5xx, or a prefill answer
without `kv_transfer_params`) is handled as the model's `disaggregation.on_failure` says: the whole request on
the model's own plain replicas (then its fallbacks), both steps once more elsewhere, or a 502.

A streamed decode that breaks after the client has bytes (what was sent cannot be unsent) is continued in the same
stream as `on_failure` says (midstream.py): `plain` on one of the model's own replicas, `retry` on another decode
replica, each sent the request with the text already streamed as the start of its answer; `fail`, a stream that
cannot be continued (a tool call, several choices), or a continuation that fails too, ends the stream with an
error event. The usage row then counts the continuation's prompt (the client's and the text it read again) and
both attempts' completion tokens.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
import orjson

from llmgw.core.config.models import Disaggregation
from llmgw.core.snapshot import PublishedModel
from llmgw_router.decisions.disagg import (
    Streamed,
    continued_body,
    decode_body,
    kv_host,
    near_kv,
    prefill_body,
    returned_params,
)
from llmgw_router.decisions.scheduler import RequestInfo
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.options import RouterOptions
from llmgw_router.path.accounting import Call
from llmgw_router.path.disaggregated.midstream import DecodeStream
from llmgw_router.path.lora import Adapters
from llmgw_router.path.upstream_call import Kind, upstream_call
from llmgw_router.routing.forwarding import Forwarding, Picked
from llmgw_router.server.errors import ApiError
from llmgw_router.server.exchange import Exchange, HttpReply
from llmgw_router.upstream.http1 import EngineClient
from llmgw_router.upstream.proxy import ProxyResult, UpstreamCall, UpstreamUnavailable, fetch

__all__ = ["TWO_STEP_KINDS", "serve_disaggregated"]

TWO_STEP_KINDS = frozenset({"chat", "completions"})  # what vLLM's P/D serves; the rest go to plain replicas


class RequestService(Protocol):
    """What the two steps use of the request service (path/service.py's RequestService), which calls them."""

    forwarding: Forwarding
    metrics: RouterMetrics
    session: aiohttp.ClientSession | None
    engines: EngineClient | None
    adapters: Adapters
    last_used: dict[str, float]
    clock: Callable[[], float]
    options: RouterOptions

    def _request_info(
        self, table: RoutingTable, canonical: str, body: dict[str, Any], call: Call, project: str | None
    ) -> RequestInfo: ...

    async def _send(
        self, exchange: Exchange, up: UpstreamCall, call: Call, served: PublishedModel, body: dict[str, Any]
    ) -> ProxyResult: ...

    async def _forward(
        self,
        exchange: Exchange,
        kind: Kind,
        table: RoutingTable,
        canonical: str,
        raw: bytes,
        body: dict[str, Any],
        call: Call,
        plain: bool = False,
    ) -> HttpReply | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class _Asked:
    """The request being served in two steps, as every step reads it (the exchange it writes to varies: the
    client's, or the DecodeStream in front of it)."""

    svc: RequestService
    kind: Kind
    table: RoutingTable
    canonical: str
    raw: bytes
    body: dict[str, Any]
    call: Call

    @property
    def project(self) -> str | None:
        return self.call.principal.project if self.call.principal else None


class _StepFailed(UpstreamUnavailable):
    """One step failed before the client saw a byte: the request is still whole to serve elsewhere."""

    def __init__(self, role: str, endpoint: str | None, reason: str) -> None:
        super().__init__(reason)
        self.role = role
        self.endpoint = endpoint


async def serve_disaggregated(
    svc: RequestService,
    exchange: Exchange,
    kind: Kind,
    table: RoutingTable,
    canonical: str,
    raw: bytes,
    body: dict[str, Any],
    call: Call,
    pd: Disaggregation,
) -> HttpReply | None:
    """Serve the request in two steps; on a failed step, as `pd.on_failure` says."""
    asked = _Asked(svc, kind, table, canonical, raw, body, call)

    async def plain() -> HttpReply | None:
        return await svc._forward(exchange, kind, table, canonical, raw, body, call, plain=True)

    if kind not in TWO_STEP_KINDS or call.turn is not None or call.adapter is not None:
        return await plain()
    # A stream is written through a DecodeStream, so a decode that breaks mid-stream can be continued.
    stream = DecodeStream(exchange, call) if call.stream else None
    failed: frozenset[str] = frozenset()
    for attempt in (0, 1):
        try:
            reply = await _two_steps(asked, stream or exchange, pd, failed)
        except _StepFailed as exc:
            svc.metrics.pd_fallbacks.labels(canonical, pd.on_failure).inc()
            call.attempts = [
                *(call.attempts or ()),
                {"endpoint": exc.endpoint or "", "model": canonical, "reason": f"{exc.role}: {exc.reason}"},
            ]
            if exc.endpoint is not None:
                failed = failed | {exc.endpoint}
            if pd.on_failure == "plain":
                return await plain()
            if pd.on_failure == "fail" or attempt == 1:
                again = "; tried twice" if attempt == 1 else ""
                raise ApiError(
                    502,
                    f"The {exc.role} step of `{canonical}` failed ({exc.reason}){again}.",
                    "upstream_unavailable",
                    "server_error",
                ) from None
            continue  # retry: both steps once more
        if stream is not None and stream.broke:  # the client has part of the answer: no step fails now
            await _continue(asked, stream, pd)
        return reply
    raise AssertionError("unreachable: the loop returns or raises")


async def _two_steps(
    asked: _Asked, exchange: Exchange, pd: Disaggregation, failed: frozenset[str]
) -> HttpReply | None:
    svc, table, call, project = asked.svc, asked.table, asked.call, asked.project
    info = dataclasses.replace(
        svc._request_info(table, pd.prefill, asked.body, call, project), exclude=failed
    )
    prefill = await _pick(svc, table, pd.prefill, call, info, "prefill")
    answer = await _prefill(asked, prefill)
    if isinstance(answer, HttpReply):  # the engine refused the request itself (a 4xx): the client's to read
        call.result = ProxyResult(answer, answer.status)
        return answer
    decode = _near(svc, table, pd.decode, project or "", failed, kv_host(answer or {}))
    if decode is None:
        decode = await _pick(
            svc, table, pd.decode, call, RequestInfo(project=project or "", exclude=failed), "decode"
        )
    return await _decode(asked, exchange, decode, answer)


async def _pick(
    svc: RequestService, table: RoutingTable, pool: str, call: Call, info: RequestInfo, role: str
) -> Picked:
    """A replica of `pool`, waiting in its line when none has room; a pool with none at all is a failed step."""
    asked = time.monotonic()
    place = svc.forwarding.place(table, call.principal.project if call.principal else None, pool)
    try:
        picked = await svc.forwarding.pick(table, pool, (pool,), info, place)
    except ApiError as err:
        if err.status != 503:
            raise
        raise _StepFailed(role, None, f"no {role} replica: {err.message}") from None
    waited = time.monotonic() - asked
    call.queue_s = waited if call.queue_s is None else call.queue_s + waited
    svc.last_used[pool] = svc.clock()
    if call.trace is not None:
        call.trace.scheduled(asked, picked)
    return picked


def _near(
    svc: RequestService,
    table: RoutingTable,
    pool: str,
    project: str,
    failed: frozenset[str],
    host: str | None,
) -> Picked | None:
    """A decode replica with room on the host holding the prefill's KV, as the scheduler picks among those."""
    endpoints = table.endpoints.get(pool, ())
    near = near_kv(((ep.id, ep.api_base) for ep in endpoints), host) - failed
    if not near:
        return None
    others = frozenset(ep.id for ep in endpoints) - near
    got = svc.forwarding.claim(
        table, pool, RequestInfo(project=project, exclude=failed | others), need_room=True
    )
    if got is None:
        return None
    svc.forwarding.admission.admitted(pool, project, 1.0)
    return Picked(got[0], pool, got[1])


async def _prefill(asked: _Asked, picked: Picked) -> dict[str, Any] | HttpReply | None:
    """The prefill step: the KV's `kv_transfer_params` from its answer (None: it returned none), or the
    engine's refusal of the request."""
    svc, kind, table, raw, body, call = asked.svc, asked.kind, asked.table, asked.raw, asked.body, asked.call
    ep, pool = picked.endpoint, picked.served
    started = time.monotonic()
    assert svc.session is not None, "opened with the listeners"
    try:
        up = upstream_call(kind, table, pool, raw, body, call, picked, False, 1, svc.adapters)
        up.payload = orjson.dumps(prefill_body(orjson.loads(up.payload)))
        up.stream = False
        status, answer = await fetch(svc.session, svc.engines, up)
        if status >= 500:
            raise UpstreamUnavailable(f"engine answered {status}")
    except UpstreamUnavailable as exc:
        _step_done(svc, pool, "prefill", started, ok=False)
        svc.forwarding.failed(ep, f"prefill: {exc.reason}")
        raise _StepFailed("prefill", ep.id, exc.reason) from None
    finally:
        svc.forwarding.release(ep, pool)
    svc.forwarding.succeeded(ep)
    _step_done(svc, pool, "prefill", started, ok=True)
    if status != 200:
        return HttpReply(
            status, orjson.dumps(answer), {**up.reply_headers, "Content-Type": "application/json"}
        )
    # None: a connector that finds the KV by the prompt itself (vLLM's ExampleConnector, a shared store)
    # returns no parameters; the decode goes without, as vLLM's own proxy sends it.
    return returned_params(answer)


async def _decode(
    asked: _Asked, exchange: Exchange, picked: Picked, params: dict[str, Any] | None
) -> HttpReply | None:
    """The decode step, streamed to the client when it asked: the request's answer and its usage row."""
    svc, kind, table, canonical, call = asked.svc, asked.kind, asked.table, asked.canonical, asked.call
    raw, body = asked.raw, asked.body
    ep, pool = picked.endpoint, picked.served
    started = time.monotonic()
    call.endpoint, call.decision, call.canary = ep.id, picked.decision, ep.spec.canary
    # One usage row, under the model asked for and at its prices; set before the stream starts, so a client
    # gone mid-stream is charged as on any path.
    call.served = canonical
    try:
        up = upstream_call(kind, table, pool, raw, body, call, picked, False, 0, svc.adapters)
        if params is not None:
            up.payload = orjson.dumps(decode_body(orjson.loads(up.payload), params))
        up.reply_headers["x-llmgw-model"] = canonical  # the model asked for, served in two steps
        call.result = await svc._send(exchange, up, call, table.models[pool], body)
    except UpstreamUnavailable as exc:
        call.served = None  # nothing served yet: the fallback or the 502 says what happened
        _step_done(svc, pool, "decode", started, ok=False)
        svc.forwarding.failed(ep, f"decode: {exc.reason}")
        raise _StepFailed("decode", ep.id, exc.reason) from None
    finally:
        svc.forwarding.release(ep, pool)
    if call.trace is not None:
        call.trace.upstream_end(call.result)
    result = call.result
    # A stream that ended without its [DONE] broke too, whether the engine's connection failed or just closed.
    cut = result.response is None and not result.finished and not result.client_gone
    broke = result.status >= 500 or result.upstream_failed or cut
    if broke:
        svc.forwarding.failed(ep, f"decode: status {call.result.status}")
    else:
        svc.forwarding.succeeded(ep)
    _step_done(svc, pool, "decode", started, ok=not broke)
    return call.result.response


async def _continue(asked: _Asked, stream: DecodeStream, pd: Disaggregation) -> None:
    """The decode broke after the client had bytes: continue its stream as `pd.on_failure` says, else end it
    with an error event."""
    svc, kind, canonical, body, call = asked.svc, asked.kind, asked.canonical, asked.body, asked.call
    done = stream.given()
    svc.metrics.pd_fallbacks.labels(canonical, pd.on_failure).inc()
    broken = f"decode: the stream broke after {done.tokens} tokens"
    call.attempts = [
        *(call.attempts or ()),
        {"endpoint": call.endpoint, "model": canonical, "reason": broken},
    ]
    why: str | None = "on_failure is fail"
    if pd.on_failure != "fail" and continued_body(kind, body, done) is None:
        why = "it cannot be continued (not one choice of plain text, or its max_tokens spent)"
    elif pd.on_failure != "fail":
        pool = canonical if pd.on_failure == "plain" else pd.decode
        try:
            why = await _continuation(asked, stream, pool, done)
        except _StepFailed as exc:  # no replica to continue on
            why = exc.reason
        except ApiError as err:  # the line to the replicas refused it (full, timed out)
            why = err.message
    if why is None or (call.result is not None and call.result.client_gone):
        return
    call.code = "upstream_unavailable"
    message = f"The decode of `{canonical}` broke off mid-stream and was not continued: {why}."
    await stream.fail(svc.options.write_timeout, message)


async def _continuation(asked: _Asked, stream: DecodeStream, pool: str, done: Streamed) -> str | None:
    """Send the continuation to a replica of `pool` (not the one that broke), into the client's stream; None when
    it finished the stream, else why not."""
    svc, kind, table, raw, body, call = asked.svc, asked.kind, asked.table, asked.raw, asked.body, asked.call
    info = RequestInfo(project=asked.project or "", exclude=frozenset({call.endpoint}))
    picked = await _pick(svc, table, pool, call, info, "continue")
    ep = picked.endpoint
    call.endpoint, call.decision, call.canary = ep.id, picked.decision, ep.spec.canary
    started = time.monotonic()
    try:
        up = upstream_call(kind, table, pool, raw, body, call, picked, False, 1, svc.adapters)
        sent = continued_body(kind, orjson.loads(up.payload), done)
        if sent is None:
            return "its max_tokens is spent"
        up.payload = orjson.dumps(sent)
        stream.continuing(done)
        result = call.result = await svc._send(stream, up, call, table.models[pool], body)
    except UpstreamUnavailable as exc:
        if call.trace is not None:
            call.trace.upstream_end(None, exc.reason)
        _step_done(svc, pool, "continue", started, ok=False)
        svc.forwarding.failed(ep, f"continuation: {exc.reason}")
        return f"the continuation on {ep.id} failed ({exc.reason})"
    finally:
        svc.forwarding.release(ep, pool)
    if call.trace is not None:
        call.trace.upstream_end(result)
    if stream.first_byte_at is not None:  # the request's first token is the broken stream's
        result.first_byte_at = stream.first_byte_at
    why = None
    if result.response is not None:  # a whole answer to a stream: the engine refused it
        why = f"the continuation on {ep.id} was answered {result.status}"
    elif stream.end_held:
        why = f"the continuation on {ep.id} broke too"
    _step_done(svc, pool, "continue", started, ok=why is None)
    if why is not None:
        svc.forwarding.failed(ep, f"continuation: {why}")
    else:
        svc.forwarding.succeeded(ep)
    return why


def _step_done(svc: RequestService, pool: str, role: str, started: float, *, ok: bool) -> None:
    svc.metrics.count(svc.metrics.pd_steps, (pool, role, "ok" if ok else "failed"))
    if ok:
        svc.metrics.pd_step_seconds.labels(pool, role).observe(time.monotonic() - started)
