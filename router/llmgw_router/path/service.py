"""The request path, in the design's order (cheapest refusal first, and nothing about the catalog before auth):

body size -> parse (JSON shape) -> auth -> resolve model -> allowlist -> capability -> context length and
reservation -> fallback chain (the published one, minus what the project may not use) -> limits -> admission ->
schedule -> proxy -> account.

`RequestService` holds the live state of one router process (no globals): the routing table from the last
snapshot, the live endpoint records, and the small interfaces to the outside (keys, limits, usage,
controller). Where a request goes is forwarding.py's; what it is charged is accounting.py's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import aiohttp

from llmgw.adapters import logformat
from llmgw.core.evals.guardrails import CompiledGuardrail
from llmgw.core.snapshot import PublishedAdapter, PublishedModel, RouterSnapshot, Tenants
from llmgw_router.decisions.capabilities import lacked, needs_of, unsupported
from llmgw_router.decisions.media.forms import AUDIO_KINDS, audio_form, form_parts
from llmgw_router.decisions.media.images import image_request
from llmgw_router.decisions.rules import (
    NO_COMPLETION,
    conversation_key,
    fits,
    parse,
    size,
    valid_traceparent,
)
from llmgw_router.decisions.scheduler import RequestInfo
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.fleet.ports import ControllerCallbacks, NoController, NullUsage, UsageSink
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.options import RouterOptions
from llmgw_router.path.accounting import Call, gone, settle
from llmgw_router.path.auth import Authenticator
from llmgw_router.path.cache import CachePath
from llmgw_router.path.disaggregated.two_steps import serve_disaggregated
from llmgw_router.path.guard import GUARDED_KINDS, Guard, ask_judge
from llmgw_router.path.lookup import RecentRequests, request_id_for
from llmgw_router.path.lora import Adapters
from llmgw_router.path.media import check_media
from llmgw_router.path.models_page import models_page
from llmgw_router.path.ratelimit import Limiter, NoLimits, budget_use, upfront_cost
from llmgw_router.path.steering import Steering, refused_error
from llmgw_router.path.tags import HEADER as TAGS_HEADER, request_tags
from llmgw_router.path.upstream_call import Kind, upstream_call
from llmgw_router.routing import allowlist
from llmgw_router.routing.admission import Admission
from llmgw_router.routing.forwarding import Forwarding, Picked, Place, fallback_chain
from llmgw_router.routing.peering import HOP_HEADER, arrived, refuse_withdrawn
from llmgw_router.server.errors import ApiError, error_response
from llmgw_router.server.exchange import Exchange, HttpReply
from llmgw_router.surfaces.images.generate import WorkflowFiles, generate_images
from llmgw_router.surfaces.kept_bodies import BodyKeeper
from llmgw_router.surfaces.responses.exchange import ResponsesTurn
from llmgw_router.surfaces.responses.keeper import ResponseKeeper
from llmgw_router.upstream.http1 import EngineClient
from llmgw_router.upstream.provider_keys import ProviderHealth, usable_providers
from llmgw_router.upstream.proxy import ProxyResult, UpstreamCall, UpstreamUnavailable, forward

if TYPE_CHECKING:
    from llmgw_router.path.tracing import RequestTracer

__all__ = ["Kind", "RequestService", "Router", "RouterOptions"]

log = logging.getLogger(__name__)

_DEFAULT_MAX_BODY = 4 * 1024 * 1024
_GONE = (asyncio.CancelledError, ConnectionResetError, aiohttp.ClientConnectionResetError)


class RequestService:
    def __init__(
        self,
        options: RouterOptions | None = None,
        auth: Authenticator | None = None,
        limiter: Limiter | None = None,
        usage: UsageSink | None = None,
        controller: ControllerCallbacks | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.options = options or RouterOptions()
        self.auth = auth or Authenticator(None)
        self.auth.tenants = self._tenants  # a personal key's memberships: today's snapshot's, at each request
        self.limiter: Limiter = limiter or NoLimits()
        self.usage: UsageSink = usage or NullUsage()
        self.clock = clock
        self.rng = rng or random.Random()
        self.table: RoutingTable | None = None
        self.admission = Admission(256, on_reject=self._on_reject, model_queue_size=128)
        self.metrics = RouterMetrics(
            lambda: self.table, lambda: float(self.admission.depth), clock, budgets=self._budget_use
        )
        self.forwarding = Forwarding(
            lambda: self.table,
            self.admission,
            self.metrics,
            self.options,
            controller or NoController(),
            clock,
            self.rng,
        )
        self.guard = Guard(lambda: self.table, self.metrics.registry)
        self.session: aiohttp.ClientSession | None = None
        self.engines: EngineClient | None = None  # plain-http engines; opened with the session
        self.last_used: dict[str, float] = {}
        self.provider_health = ProviderHealth(self.metrics.provider_unavailable)
        self.recent = RecentRequests()  # the last requests finished, for `llmgw request ID` (lookup.py)
        self.tracer: RequestTracer | None = None  # set when an OTLP endpoint is configured (app.py)
        # The projects' response caches (path/cache.py), counted as the request metrics are.
        self.cache = CachePath(self.metrics.registry, self.metrics.count)
        self.adapters = Adapters()  # LoRA adapters: names, affinity, runtime loads (path/lora.py)
        self.kept_responses: ResponseKeeper | None = None  # with a content key: stored responses (app.py)
        self.draining = False  # stopping (main.py): /ready says not ready while requests still come in
        self.kept_bodies: BodyKeeper | None = None  # with a content key: projects' kept bodies (app.py)
        self.workflows = WorkflowFiles()  # ComfyUI models' workflow files (surfaces/images)

    def load_report(self) -> dict[str, Any]:
        """The `load` message the controller link sends (llmgw_router.fleet.load)."""
        return self.metrics.load.report(self.table, self.admission.queued)

    @property
    def controller(self) -> ControllerCallbacks:
        """Who loads on-demand models: the ControllerLink, once there is one (it needs the service first)."""
        return self.forwarding.controller

    @controller.setter
    def controller(self, controller: ControllerCallbacks) -> None:
        self.forwarding.controller = controller

    # ------------------------------------------------------------------ snapshot

    def apply_snapshot(self, snapshot: RouterSnapshot) -> None:
        previous = {ep.id: ep for ep in self.table.all_endpoints()} if self.table else {}
        # A provider whose key or URL cannot be used is dropped alone; the rest of the snapshot (allowlists,
        # limits) still applies rather than leaving this router on the previous revision's policy.
        usable = usable_providers(snapshot, self.options.secrets)
        self.provider_health.update(usable.unavailable)
        snapshot = usable.snapshot
        self.table = RoutingTable.build(snapshot, previous, self.clock(), usable.keys)
        self.admission.queue_size = snapshot.router.admission.queue_size
        self.admission.model_queue_size = snapshot.router.admission.model_queue_size
        self.admission.forget(self.table.models)
        self.cache.configure(snapshot.tenants.projects)
        self.adapters.forget(self.table)
        self.forwarding.prefix.forget([ep.id for ep in self.table.all_endpoints()])
        self.metrics.set_revision(snapshot.revision)
        self.admission.notify_all()  # the new table may have room, or the replica a request waits for
        log.info(
            "snapshot %s: %d models, %d endpoints",
            snapshot.revision,
            len(snapshot.models),
            len(snapshot.endpoints),
        )

    def _budget_use(self) -> list[tuple[str, str, float]]:
        table = self.table
        return budget_use(self.limiter, table.snapshot.tenants) if table is not None else []

    def _on_reject(self, reason: str) -> None:
        self.metrics.rejections.labels(reason).inc()

    # ------------------------------------------------------------------ simple pages

    def body_limit(self) -> int:
        """The largest request body taken now: the snapshot's, or a default before the first one."""
        table = self.table
        return table.snapshot.router.max_body_bytes if table is not None else _DEFAULT_MAX_BODY

    async def models(self, exchange: Exchange) -> None:
        exchange.respond(await self._models(exchange))

    async def model(self, exchange: Exchange) -> None:
        """`GET /v1/models/{id}`: the card `/v1/models` lists for it, or the same 404 as a model that does
        not exist when this caller may not see it (never telling which)."""
        exchange.respond(await self._models(exchange, unquote(exchange.path.removeprefix("/v1/models/"))))

    async def _models(self, exchange: Exchange, one: str | None = None) -> HttpReply:
        table = self.table
        if table is None:
            return error_response(_not_ready())
        try:
            principal = await self.auth.caller(exchange)
        except ApiError as err:
            return error_response(err)
        return models_page(table, principal.project, one, self.forwarding.schedulable, self.adapters)

    def _tenants(self) -> Tenants:
        return self.table.snapshot.tenants if self.table is not None else Tenants()

    # ------------------------------------------------------------------ the request path

    async def handle(self, exchange: Exchange, kind: Kind, turn: ResponsesTurn | None = None) -> None:
        """Serve one request. `turn`: a Responses API turn (its exchange a ResponsesExchange), served as the
        chat it translates to."""
        call = Call(request_id_for(exchange.headers.get("x-request-id")), time.monotonic())
        call.turn = turn
        logformat.bind(request_id=call.request_id)  # every line this request's task logs carries it
        traceparent = exchange.headers.get("traceparent")
        if self.tracer is not None:
            call.trace = self.tracer.begin(
                call.request_id, kind, traceparent, exchange.headers.get("tracestate"), call.started
            )
        elif traceparent is not None:
            call.traceparent = valid_traceparent(traceparent)
        response: HttpReply | None
        try:
            response = await self._handle(exchange, kind, call)
            left = call.result is not None and call.result.client_gone
            status = response.status if response is not None else 200  # None: a stream went out
            call.status, call.code = gone(call) if left else (status, call.code)
        except ApiError as err:
            call.status, call.code = err.status, err.code or ""
            response = error_response(err)
        except _GONE:
            call.status, call.code = gone(call)
            self._account(call)
            raise
        except Exception:
            log.exception("request %s failed inside the router", call.request_id)
            call.status, call.code = 500, "internal_error"
            response = error_response(
                ApiError(500, "Internal error in the router.", "internal_error", "server_error")
            )
        # Send the answer before the bookkeeping (metrics, limits, usage): the client need not wait for it.
        try:
            if response is not None and not exchange.started:
                # A refusal too says which request it was: what `llmgw request ID` looks up.
                response.headers.setdefault("x-request-id", call.request_id)
                if call.ending is not None:  # its slots are free before the client can read the answer
                    call.ending()
                exchange.respond(response)
        except _GONE:
            call.status, call.code = gone(call)
            raise
        finally:
            self._account(call)
            if call.keeping is not None and self.kept_bodies is not None:
                self.kept_bodies.finish(
                    call.keeping, call.request_id, call.model, call.served, call.status, response
                )

    async def _handle(self, exchange: Exchange, kind: Kind, call: Call) -> HttpReply | None:
        table = self.table
        if table is None:
            raise _not_ready()
        call.hops = arrived(table, exchange.headers.get(HOP_HEADER))  # from a peer: 508 round a loop
        client_raw, raw, body, kind = await self._read(exchange, kind, table, call)
        # Who is asking comes before anything that depends on the catalog: an anonymous client learns neither
        # which models exist (404) nor their context lengths (400).
        began = time.monotonic()
        call.principal = await self.auth.caller(exchange)
        if call.trace is not None:
            call.trace.span("auth", began)
        call.tags = request_tags(body, exchange.headers.get(TAGS_HEADER))
        name, canonical, adapter = self._resolve(table, body, call)
        call.model = canonical
        model = table.models[canonical]
        tenant_project = allowlist.tenant_project(table, call.principal.project, canonical, name)
        if adapter is not None:
            self.adapters.check(name, adapter, tenant_project)
        # What it needs of a model: a fallback lacking it is left out of the chain, the model refuses it.
        needs = needs_of(body, vision=canonical in table.vision_checked) if kind == "chat" else frozenset()
        missing = lacked(model, kind, needs)
        if missing is not None:
            raise refused_error(unsupported(canonical, model, missing))
        project = call.principal.project
        # A stored response (kept, or continued from) is the key's project's: decided once it is known.
        if call.turn is not None:
            body, raw = await call.turn.bind(project, table.snapshot.tenants)
        if kind == "chat":  # a Responses or Messages turn too: the chat it became (M13)
            await check_media(body, table.snapshot.router.media_hosts)
        elif kind == "images":  # a bad size or count is a 400 before it takes a place under the limits
            image_request(body)
        guards = self.guard.guards_for(table, project, canonical) if kind in GUARDED_KINDS else ()
        if guards:  # before sizing: a redacted prompt is what the engine is sent and charged for
            judged = body  # the judge reads the prompt as the tenant wrote it, not its redaction
            body, raw, screened = await self.guard.screen_request(exchange, guards, body, raw, call)
        call.sizing = size(len(raw), body, kind, model)
        # Its shape, for a trace: known from here on, so a request refused by its limits has one too.
        call.session = conversation_key(exchange.headers, body, table.policy_for(canonical))
        call.stream = body.get("stream") is True and kind not in NO_COMPLETION
        call.serving = fallback_chain(
            table,
            canonical,
            kind,
            tenant_project,
            lambda m: fits(m, call.sizing) and lacked(m, kind, needs) is None,
        )
        if adapter is not None:
            call.serving = call.serving[:1]  # a fallback model does not carry the adapter
        if tenant_project is not None:
            await self._admit(table, tenant_project, call)
        if guards:  # a judge is asked for admitted requests only (M12)
            await self.guard.judge_request(guards, judged, screened, call, self._ask_judge)
        if self.kept_bodies is not None and tenant_project is not None:
            exchange, call.keeping = self.kept_bodies.begin(
                exchange, table.snapshot.tenants, tenant_project, call.request_id, client_raw, guards
            )
        return await self._answer(exchange, kind, table, canonical, raw, body, call, guards, tenant_project)

    async def _read(
        self, exchange: Exchange, kind: Kind, table: RoutingTable, call: Call
    ) -> tuple[bytes, bytes, dict[str, Any], Kind]:
        """The body as the client sent it (a kept body's), and as the path reads it: parsed once, a speech
        request's form fields, a Responses turn's chat (sized, limited and routed as the chat it becomes)."""
        raw = client_raw = await exchange.read_body(table.snapshot.router.max_body_bytes)
        if kind in AUDIO_KINDS:  # a multipart form, read once (decisions/media/forms.py)
            call.form = form_parts(raw, exchange.headers.get("content-type"))
        body = parse(raw) if call.form is None else audio_form(call.form)
        if call.turn is not None:
            body, raw = call.turn.begin(body, raw, call.request_id)
            kind = "chat"
        return client_raw, raw, body, kind

    def _resolve(
        self, table: RoutingTable, body: dict[str, Any], call: Call
    ) -> tuple[str, str, PublishedAdapter | None]:
        """The name the request asks for, the model that serves it, and the LoRA adapter it names (if any)."""
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(
                400, "The request needs a `model` field naming a model.", "missing_model", param="model"
            )
        canonical = table.resolve(name)
        adapter = self.adapters.resolve(table, name) if canonical is None else None
        if adapter is not None:  # a LoRA adapter: served by its base model's replicas
            canonical, call.adapter = adapter.base, name
        if canonical is None:
            raise ApiError(
                404,
                f"The model `{name}` does not exist or you do not have access to it.",
                "model_not_found",
                param="model",
            )
        peer = table.models[canonical].peer
        if peer is not None:  # a peer's model it no longer offers serves nothing: said before anything
            refuse_withdrawn(canonical, peer)
        return name, canonical, adapter

    async def _admit(self, table: RoutingTable, tenant_project: str, call: Call) -> None:
        """Takes the request's place under its project's limits (429 when there is none)."""
        call.chain = table.chain(tenant_project)
        if call.chain is None:
            return
        person = call.principal.person if call.principal is not None else None
        if person is not None:  # their share of each scope, and their own limits, pooled as the scopes'
            call.chain = table.person_chain(tenant_project, person)
        serving = [table.models[m] for m in call.serving]
        began = time.monotonic()
        try:
            call.lease = await self.limiter.acquire(
                call.chain, call.estimate, upfront_cost(serving, call.estimate)
            )
            if call.lease.admission is not None:  # its slots go back before the answer's last bytes
                call.ending = functools.partial(self.limiter.end, call.lease)
        finally:  # a 429 is a limits span too
            if call.trace is not None:
                call.trace.span("limits", began)

    async def _answer(
        self,
        exchange: Exchange,
        kind: Kind,
        table: RoutingTable,
        canonical: str,
        raw: bytes,
        body: dict[str, Any],
        call: Call,
        guards: tuple[CompiledGuardrail, ...],
        tenant_project: str | None,
    ) -> HttpReply | None:
        """Forward the admitted request: through the output guardrails when any apply, else through the
        project's response cache (a hit never reaches an engine). Pictures are neither (no text to screen,
        and a drawn seed makes each answer another)."""
        if kind == "images" or kind in AUDIO_KINDS:
            return await self._forward(exchange, kind, table, canonical, raw, body, call)
        if any(g.checks("output") for g in guards):
            # Screened answers are not cached: a stream cut by a rule is no answer to replay.
            return await self.guard.forward_screened(
                exchange,
                guards,
                body,
                call,
                self._ask_judge,
                lambda ex: self._forward(ex, kind, table, canonical, raw, body, call),
            )
        cached = self.cache.begin(exchange, kind, body, tenant_project, canonical, call.adapter)
        if cached is None:
            return await self._forward(exchange, kind, table, canonical, raw, body, call)
        if cached.hit is not None:
            return await self.cache.serve(cached, call, self.options.write_timeout)
        reply = await self._forward(cached.exchange, kind, table, canonical, raw, body, call)
        return self.cache.finish(cached, call, reply)

    async def _ask_judge(self, model: str, prompt: str, limit_s: float) -> str | None:
        return await ask_judge(self.table, self.forwarding, self.session, model, prompt, limit_s)

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
    ) -> HttpReply | None:
        """Pick an endpoint and send the request there; an engine that cannot be reached is excluded and the
        pick made once more, then it is a 502. A disaggregated model's request goes in two steps unless
        `plain` (its own replicas serving it whole: path/disaggregated/two_steps.py)."""
        if table.disaggregated and not plain and (pd := table.disaggregated.get(canonical)) is not None:
            return await serve_disaggregated(self, exchange, kind, table, canonical, raw, body, call, pd)
        headers = exchange.headers
        project = call.principal.project if call.principal else None
        info = self._request_info(table, canonical, body, call, project)
        adapter = table.snapshot.adapters.get(call.adapter) if call.adapter is not None else None
        place = self.forwarding.place(table, project, canonical)
        debug = self.options.debug_token is not None and hmac.compare_digest(  # constant time (L7)
            headers.get("x-llmgw-debug", "").encode("utf-8", "surrogateescape"),
            self.options.debug_token.encode(),
        )
        steer = Steering.of(table, call.serving, body, self.rng)
        for attempt in (0, 1):
            asked = time.monotonic()
            load_on = None
            if adapter is not None and call.adapter is not None:
                info, load_on = self.adapters.steer(table, canonical, call.adapter, adapter, info)
            steered = steer.info(table, call.serving, headers, info, self.clock())
            picked = await self._pick(table, canonical, call, steered, place, asked)
            ep, served = picked.endpoint, picked.served
            try:
                if load_on == ep.id and adapter is not None and call.adapter is not None:
                    assert self.session is not None, "opened with the listeners"
                    await self.adapters.ensure_loaded(self.session, ep, call.adapter, adapter)
                up = self._upstream_call(kind, table, canonical, raw, body, call, picked, debug, attempt)
                call.result = await self._send(exchange, up, call, table.models[served], body)
                if call.trace is not None:
                    call.trace.upstream_end(call.result)
            except UpstreamUnavailable as exc:
                self._unreachable(picked, exc, call, last=attempt == 1)
                info = dataclasses.replace(info, exclude=info.exclude | {ep.id})
                self.metrics.retries.labels(canonical).inc()
                continue
            finally:
                self.forwarding.release(ep, served)
            if call.result.status >= 500 or call.result.upstream_failed:
                self.forwarding.failed(ep, f"status {call.result.status}")
            else:
                self.forwarding.succeeded(ep)
            return call.result.response
        raise AssertionError("unreachable: the loop returns or raises")

    async def _pick(
        self,
        table: RoutingTable,
        canonical: str,
        call: Call,
        info: RequestInfo,
        place: Place,
        asked: float,
    ) -> Picked:
        """An endpoint for this attempt (waiting in the line when none has room), noted on the call."""
        try:
            picked = await self.forwarding.pick(table, canonical, call.serving, info, place)
        except ApiError as err:  # queue full or timed out, no endpoint, still loading
            if call.trace is not None:
                call.trace.span("schedule", asked, None, {"llmgw.refused": err.code or str(err.status)})
            raise
        ep, served = picked.endpoint, picked.served
        call.served = served
        waited = time.monotonic() - asked  # the queue time: both picks, when a retry picks again
        call.queue_s = waited if call.queue_s is None else call.queue_s + waited
        call.endpoint, call.decision, call.canary = ep.id, picked.decision, ep.spec.canary
        if call.trace is not None:
            call.trace.scheduled(asked, picked)
        self.last_used[served] = self.clock()
        return picked

    def _upstream_call(
        self,
        kind: Kind,
        table: RoutingTable,
        canonical: str,
        raw: bytes,
        body: dict[str, Any],
        call: Call,
        picked: Picked,
        debug: bool,
        attempt: int,
    ) -> UpstreamCall:
        """The request as the picked endpoint is sent it (a Responses turn: translated or not, by engine)."""
        if call.turn is not None:
            ep = picked.endpoint
            kind, raw, body = call.turn.for_engine(None if ep.is_provider else ep.spec.engine)  # type: ignore[assignment]
        return upstream_call(kind, table, canonical, raw, body, call, picked, debug, attempt, self.adapters)

    def _unreachable(self, picked: Picked, exc: UpstreamUnavailable, call: Call, last: bool) -> None:
        """An endpoint that could not be reached: noted (the breaker, the call's attempts); a 502 when it was
        the last attempt."""
        ep, served = picked.endpoint, picked.served
        if call.trace is not None:
            call.trace.upstream_end(None, exc.reason)
        self.forwarding.failed(ep, exc.reason)
        call.attempts = [*(call.attempts or ()), {"endpoint": ep.id, "model": served, "reason": exc.reason}]
        if last:
            raise ApiError(
                502,
                f"The engine serving `{served}` could not be reached ({exc.reason}); retried once.",
                "upstream_unavailable",
                "server_error",
            ) from None

    def _request_info(
        self, table: RoutingTable, canonical: str, body: dict[str, Any], call: Call, project: str | None
    ) -> RequestInfo:
        """What the scheduler is told about the request: its session, its prompt's prefix, its project."""
        policy = table.policy_for(canonical)
        published = table.models.get(canonical)
        tokenizer_dir = None if published is None else published.tokenizer_dir
        return RequestInfo(
            session_key=call.session if policy.weights.session > 0 else None,
            prefix=self.forwarding.prefix.key(body, policy, project, tokenizer_dir),
            project=project or "",
        )

    async def _send(
        self, exchange: Exchange, up: UpstreamCall, call: Call, served: PublishedModel, body: dict[str, Any]
    ) -> ProxyResult:
        assert self.session is not None, "the client session is opened with the listeners (app.serve)"
        comfyui = (
            served.provider if served.provider is not None and served.provider.api == "comfyui" else None
        )
        if comfyui is not None:  # a workflow, run at the ComfyUI server (surfaces/images)
            flow = self.workflows.workflow(comfyui.workflow)
            base = comfyui.url.rstrip("/")
            return await generate_images(self.session, base, flow, body, up, self.rng)
        return await forward(
            self.session,
            exchange,
            up,
            self.engines,
            call.streaming,
            write_timeout=self.options.write_timeout,
            ending=call.ending,
        )

    # ------------------------------------------------------------------ accounting

    def _account(self, call: Call) -> None:
        settle(
            call,
            self.table,
            self.metrics,
            self.limiter,
            self.usage,
            self.clock,
            self.options.router_id,
            self.recent,
        )
        if call.trace is not None:
            call.trace.end(call.status, call.code, call.model, call.served)


# Most tests and callers still say Router: the same class.
Router = RequestService


# ---------------------------------------------------------------------------------------------- helpers


def _not_ready() -> ApiError:
    return ApiError(
        503,
        "The router has no snapshot yet; retry shortly.",
        "router_not_ready",
        "server_error",
        headers={"Retry-After": "1"},
    )
