"""The request path, in the design's order (cheapest refusal first, and nothing about the catalog before auth):

body size -> parse (JSON shape) -> auth -> resolve model -> allowlist -> capability -> context length and
reservation -> fallback chain (the published one, minus what the project may not use) -> limits -> admission ->
schedule -> proxy -> account.

`Router` holds the live state of one router process (no globals): the routing table from the last snapshot,
the live endpoint records, and the small interfaces to the outside (keys, limits, usage, controller).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web

from llmgw.core import jsonsafe
from llmgw.core.secretrefs import SecretPolicy
from llmgw.core.snapshot import PublishedModel, RouterSnapshot, Tenants
from llmgw.store.records import UsageRecord
from llmgw_router import breaker as brk
from llmgw_router.admission import Admission
from llmgw_router.auth import Authenticator, Principal
from llmgw_router.errors import ApiError, error_response
from llmgw_router.fields import plan_fields
from llmgw_router.http1 import EngineClient
from llmgw_router.metrics import RouterMetrics
from llmgw_router.ports import ControllerCallbacks, NoController, NullUsage, UsageSink
from llmgw_router.provider_keys import DEFAULT_SECRETS_DIR, ProviderHealth, usable_providers
from llmgw_router.proxy import ProxyResult, UpstreamCall, UpstreamUnavailable, forward
from llmgw_router.ratelimit import Lease, Limiter, NoLimits, budget_use
from llmgw_router.scheduler import Decision, RequestInfo, schedule
from llmgw_router.state import LiveEndpoint, RoutingTable
from llmgw_router.tenancy import TenantChain

__all__ = ["Kind", "Router", "RouterOptions"]

log = logging.getLogger(__name__)

Kind = Literal["chat", "completions", "embeddings"]
_PATHS: dict[str, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}
_DEFAULT_MAX_BODY = 4 * 1024 * 1024
_LOAD_REQUEST_INTERVAL = 10.0


@dataclass(frozen=True)
class RouterOptions:
    router_id: str = "router"
    on_demand_wait: float = 5.0  # how long the first request for an on-demand model waits for a replica
    loading_retry_after: int = 10
    debug_token: str | None = None  # requests sending it in x-llmgw-debug get the decision's rationale
    breaker: brk.BreakerPolicy = field(default_factory=brk.BreakerPolicy)
    connect_timeout: float = 5.0
    read_timeout: float = 600.0  # idle: the longest silence of an engine while an answer is expected
    request_deadline: float = 3600.0  # an engine's whole answer, stream or not, however steadily it comes
    write_timeout: float = 30.0  # a stream's client that accepts no byte for this long is cut off
    # Where the repo's provider keys may be read from: the router's settings, never the repo's.
    secrets: SecretPolicy = field(default_factory=lambda: SecretPolicy(DEFAULT_SECRETS_DIR).absolute())


@dataclass
class _Call:
    """One request's bookkeeping, filled in as it goes down the path."""

    request_id: str
    started: float
    model: str = "unknown"
    served: str | None = None
    principal: Principal | None = None
    chain: TenantChain | None = None
    serving: tuple[str, ...] = ()  # the requested model, then the fallbacks this request may use, in order
    prompt_estimate: int = 0  # tokens, from the body's size
    completion_asked: int | None = None  # max_completion_tokens / max_tokens; None when the client set none
    completion_cap: int = 0  # the most tokens one sequence may generate: what was asked, else the model's cap
    sequences: int = 1  # n / best_of: completions generated at once
    status: int = 500
    code: str = ""
    result: ProxyResult | None = None
    lease: Lease | None = None

    @property
    def estimate(self) -> int:
        """Tokens the request may take: reserved at admission, corrected at the end. A request that names no
        max_tokens is sent the cap it reserved, so the engine cannot spend more than this."""
        return self.prompt_estimate + self.completion_cap * self.sequences

    def streaming(self, result: ProxyResult) -> None:
        """A stream started: keep its result now, so a handler cancelled later still accounts its usage."""
        self.result = result


def _gone(call: _Call) -> tuple[int, str]:
    """Status for a request whose client went away: 499, unless it had the whole answer already."""
    if call.result is not None and call.result.finished:
        return 200, ""
    return 499, "client_closed_request"


class Router:
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
        self.limiter: Limiter = limiter or NoLimits()
        self.usage: UsageSink = usage or NullUsage()
        self.controller: ControllerCallbacks = controller or NoController()
        self.clock = clock
        self.rng = rng or random.Random()
        self.table: RoutingTable | None = None
        self.admission = Admission(256, on_reject=self._on_reject)
        self.metrics = RouterMetrics(
            lambda: self.table, lambda: float(self.admission.depth), clock, budgets=self._budget_use
        )
        self.session: aiohttp.ClientSession | None = None
        self.engines: EngineClient | None = None  # plain-http engines; opened with the session
        self.last_used: dict[str, float] = {}
        self._rr: dict[str, int] = {}
        self._load_requested: dict[str, float] = {}
        self._snapshot_changed = asyncio.Event()
        self.provider_health = ProviderHealth(self.metrics.provider_unavailable)

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
        self.metrics.set_revision(snapshot.revision)
        self._snapshot_changed.set()
        self._snapshot_changed = asyncio.Event()
        self.admission.notify_all()
        log.info(
            "snapshot %s: %d models, %d endpoints",
            snapshot.revision,
            len(snapshot.models),
            len(snapshot.endpoints),
        )

    def _budget_use(self) -> list[tuple[str, str, float]]:
        table = self.table
        return budget_use(self.limiter, table.snapshot.tenants) if table is not None else []

    @staticmethod
    def _estimate_cost(models: list[PublishedModel], tokens: int) -> float:
        # Charged against budgets up front at the dearest price of any model that may serve the request (a
        # fallback may cost more than the model asked for), corrected when the request ends.
        return (
            tokens * max(max(m.prices.input_per_million, m.prices.output_per_million) for m in models) / 1e6
        )

    def _on_reject(self, reason: str) -> None:
        self.metrics.rejections.labels(reason).inc()

    # ------------------------------------------------------------------ simple pages

    async def models(self, request: web.Request) -> web.Response:
        table = self.table
        if table is None:
            return error_response(_not_ready())
        try:
            principal = await self.auth.authenticate(request.headers.get("Authorization"))
        except ApiError as err:
            return error_response(err)
        now = self.clock()
        data = []
        for name, model in table.models.items():
            tenants = table.snapshot.tenants
            project = principal.project
            if project is not None and _has_tenants(tenants) and not table.allowed(project, name, name):
                continue
            if not (model.on_demand or self._can_answer(table, name, now)):
                continue
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "llmgw-simulated" if model.simulated else "llmgw",
                    "context_length": model.context_length,
                    "capabilities": list(model.capabilities),
                    "aliases": list(model.aliases),
                    "on_demand": model.on_demand,
                }
            )
        return web.json_response({"object": "list", "data": data})

    def _can_answer(self, table: RoutingTable, model: str, now: float) -> bool:
        return any(
            ep.spec.state == "ready" and not ep.breaker.is_open(now) for ep in table.endpoints.get(model, ())
        )

    # ------------------------------------------------------------------ the request path

    async def handle(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        call = _Call(_request_id(request.headers.get("x-request-id")), time.monotonic())
        try:
            response = await self._handle(request, kind, call)
            gone = call.result is not None and call.result.client_gone
            call.status, call.code = _gone(call) if gone else (response.status, call.code)
        except ApiError as err:
            call.status, call.code = err.status, err.code or ""
            response = error_response(err)
        except (asyncio.CancelledError, ConnectionResetError, aiohttp.ClientConnectionResetError):
            call.status, call.code = _gone(call)
            self._account(call)
            raise
        except Exception:
            log.exception("request %s failed inside the router", call.request_id)
            call.status, call.code = 500, "internal_error"
            response = error_response(
                ApiError(500, "Internal error in the router.", "internal_error", "server_error")
            )
        # Send the answer before the bookkeeping (metrics, limits, usage): the client need not wait for it.
        # aiohttp then finds the response already sent and only finishes the connection.
        try:
            if not response.prepared:
                await response.prepare(request)
                await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError, aiohttp.ClientConnectionResetError):
            call.status, call.code = _gone(call)
            raise
        finally:
            self._account(call)
        return response

    async def _handle(self, request: web.Request, kind: Kind, call: _Call) -> web.StreamResponse:
        table = self.table
        if table is None:
            raise _not_ready()
        raw = await _read_body(request, table.snapshot.router.max_body_bytes if table else _DEFAULT_MAX_BODY)
        body = _parse(raw)
        # Who is asking comes before anything that depends on the catalog: an anonymous client learns neither
        # which models exist (404) nor their context lengths (400).
        call.principal = await self.auth.authenticate(request.headers.get("Authorization"))
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(
                400, "The request needs a `model` field naming a model.", "missing_model", param="model"
            )
        canonical = table.resolve(name)
        if canonical is None:
            raise ApiError(
                404,
                f"The model `{name}` does not exist or you do not have access to it.",
                "model_not_found",
                param="model",
            )
        call.model = canonical
        model = table.models[canonical]
        project = call.principal.project
        tenants = table.snapshot.tenants
        if project is not None and project not in tenants.projects and _has_tenants(tenants):
            raise ApiError(
                403, f"Project `{project}` is not in the cluster repo.", "unknown_project", "permission_error"
            )
        tenant_project = project if project is not None and project in tenants.projects else None
        if tenant_project is not None and not table.allowed(tenant_project, canonical, name):
            raise ApiError(
                403,
                f"Project `{tenant_project}` may not use model `{canonical}`.",
                "model_not_allowed",
                "permission_error",
                param="model",
            )
        if kind not in model.capabilities:
            raise ApiError(
                400, f"Model `{canonical}` does not support {kind}.", "unsupported_capability", param="model"
            )
        _check_context(raw, body, kind, model, call)
        call.serving = self._chain(table, canonical, kind, call, tenant_project)
        if tenant_project is not None:
            call.chain = table.chain(tenant_project)
            if call.chain is not None:
                serving = [table.models[m] for m in call.serving]
                call.lease = await self.limiter.acquire(
                    call.chain, call.estimate, self._estimate_cost(serving, call.estimate)
                )
        return await self._forward(request, kind, table, canonical, raw, body, call)

    async def _forward(
        self,
        request: web.Request,
        kind: Kind,
        table: RoutingTable,
        canonical: str,
        raw: bytes,
        body: dict[str, Any],
        call: _Call,
    ) -> web.StreamResponse:
        info = RequestInfo(session_key=_session_key(request, body, table.policy_for(canonical)))
        debug = self.options.debug_token is not None and hmac.compare_digest(  # constant time (L7)
            request.headers.get("x-llmgw-debug", "").encode("utf-8", "surrogateescape"),
            self.options.debug_token.encode(),
        )
        client_stream = body.get("stream") is True and kind != "embeddings"
        stream_opts = body.get("stream_options")
        client_usage = isinstance(stream_opts, dict) and stream_opts.get("include_usage") is True
        for attempt in (0, 1):
            ep, served, decision = await self._pick(table, canonical, call.serving, info)
            call.served = served
            self.last_used[served] = self.clock()
            upstream_model = ep.upstream_model or served
            reply = {"x-request-id": call.request_id, "x-llmgw-model": served}
            if call.lease is not None and call.lease.admission is not None:
                reply.update(call.lease.admission.headers)  # x-ratelimit-* on every answer, as OpenAI does
            if served != canonical:
                reply["x-llmgw-fallback"] = served
            if debug:
                reply["x-llmgw-decision"] = decision.rationale()
            payload = raw
            # A request that names no max_tokens is sent the cap it reserved: the reservation bounds the spend.
            cap = _sent_cap(table.models.get(served), call, ep.is_provider) if kind != "embeddings" else None
            if body.get("model") != upstream_model or (client_stream and not client_usage) or cap is not None:
                changed = dict(body, model=upstream_model)
                if cap is not None:
                    changed["max_tokens"] = cap
                if client_stream and not client_usage:
                    changed["stream_options"] = {
                        **(stream_opts if isinstance(stream_opts, dict) else {}),
                        "include_usage": True,
                    }
                payload = json.dumps(changed).encode()
            key = ep.provider_key if ep.is_provider else ep.spec.api_key
            headers = {"Content-Type": "application/json", "x-request-id": call.request_id}
            if key:
                headers["Authorization"] = f"Bearer {key}"
            up = UpstreamCall(
                url=ep.api_base + _PATHS[kind],
                payload=payload,
                headers=headers,
                stream=client_stream,
                strip_usage_chunk=client_stream and not client_usage,
                rewrite_model=served if ep.is_provider else None,
                reply_headers=reply,
                retry_on_5xx=attempt == 0,
            )
            try:
                assert self.session is not None, "the client session is opened by the app's cleanup_ctx"
                call.result = await forward(
                    self.session,
                    request,
                    up,
                    self.engines,
                    call.streaming,
                    write_timeout=self.options.write_timeout,
                    fields=None
                    if ep.is_provider
                    else plan_fields(
                        ep.spec.engine,
                        kind,
                        body,
                        table.snapshot.router.allowed_request_fields,
                        call.principal.project if call.principal else None,
                        ep.spec.api_key,
                    ),
                )
            except UpstreamUnavailable as exc:
                self._failed(ep, exc.reason)
                if attempt == 1:
                    raise ApiError(
                        502,
                        f"The engine serving `{served}` could not be reached ({exc.reason}); retried once.",
                        "upstream_unavailable",
                        "server_error",
                    ) from None
                info = RequestInfo(info.session_key, info.exclude | {ep.id}, info.rr_counter)
                self.metrics.retries.labels(canonical).inc()
                continue
            finally:
                self._release(ep, served)
            if call.result.status >= 500 or call.result.upstream_failed:
                self._failed(ep, f"status {call.result.status}")
            else:
                ep.breaker = brk.on_success(ep.breaker)
            return call.result.response
        raise AssertionError("unreachable: the loop returns or raises")

    # ------------------------------------------------------------------ scheduling, admission, fallbacks

    def _claim(
        self, table: RoutingTable, model: str, info: RequestInfo, need_room: bool
    ) -> tuple[LiveEndpoint, Decision] | None:
        """Schedule among `model`'s endpoints and take the chosen one (inflight + 1). No await inside: the
        choice and the claim happen in one step of the event loop."""
        endpoints = table.endpoints.get(model, ())
        if not endpoints:
            return None
        now = self.clock()
        rr = self._rr.get(model, 0)
        self._rr[model] = rr + 1
        cands = [ep.candidate(now, table.stale_after) for ep in endpoints]
        info = RequestInfo(info.session_key, info.exclude, rr)
        decision = schedule(cands, table.policy_for(model), info, self.rng)
        if decision.endpoint is None:
            return None
        index = next(i for i, c in enumerate(cands) if c.id == decision.endpoint)
        chosen, ep = cands[index], endpoints[index]
        # A session's target is forwarded even when full: the scheduler bounds that queue (scheduler.py).
        if need_room and (chosen.full or chosen.stale) and chosen.id != decision.session_target:
            return None
        ok, ep.breaker = brk.allow(ep.breaker, now, self.options.breaker)
        if not ok:
            return None
        ep.inflight += 1
        self.metrics.child(self.metrics.decisions, model, decision.winning_scorer).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("decision for %s: %s", model, decision.rationale())
        return ep, decision

    def _release(self, ep: LiveEndpoint, model: str) -> None:
        ep.inflight -= 1
        self.admission.notify(model)

    def _failed(self, ep: LiveEndpoint, reason: str) -> None:
        ep.breaker = brk.on_failure(ep.breaker, self.clock(), self.options.breaker)
        log.warning("endpoint %s (%s) failed: %s", ep.id, ep.spec.model, reason)

    def _chain(
        self, table: RoutingTable, canonical: str, kind: Kind, call: _Call, project: str | None
    ) -> tuple[str, ...]:
        """The requested model, then its fallback chain as published (the controller's catalog resolved the
        aliases and followed it transitively), minus every model this request cannot use: one `project` may
        not use (a full allowed model must never hand its traffic to a model the project was not given), one
        without the capability, one whose context cannot hold the request. `project` is None when no tenants
        apply (auth disabled, or a snapshot without tenants)."""
        chain = [canonical]
        for fb in table.models[canonical].fallbacks:
            m = table.models.get(fb)
            if m is None or fb in chain or kind not in m.capabilities or not _fits(m, call):
                continue
            if project is not None and not table.allowed(project, fb, fb):
                continue
            chain.append(fb)
        return tuple(chain)

    def _schedulable(self, table: RoutingTable, model: str, exclude: frozenset[str]) -> bool:
        now = self.clock()
        return any(
            ep.spec.state == "ready" and not ep.breaker.is_open(now) and ep.id not in exclude
            for ep in table.endpoints.get(model, ())
        )

    async def _pick(
        self, table: RoutingTable, canonical: str, chain: tuple[str, ...], info: RequestInfo
    ) -> tuple[LiveEndpoint, str, Decision]:
        # `chain` holds only models the request may use, so a load is never asked for a model the project
        # was not given. `on_demand` is the catalog's: a `min 0, max 0` model is parked and never waited on.
        on_demand = [
            m for m in chain if table.models[m].on_demand and not self._schedulable(table, m, frozenset())
        ]
        for m in on_demand:
            self._ask_load(m)
        for m in chain:  # first choice: a model in the chain with room now
            got = self._claim(table, m, info, need_room=True)
            if got is not None:
                return self._picked(canonical, m, got)
        for m in chain:  # then wait in line for the first that has endpoints at all
            if self._schedulable(table, m, info.exclude):
                cell: list[tuple[LiveEndpoint, Decision]] = []

                def has_room(m: str = m, cell: list[tuple[LiveEndpoint, Decision]] = cell) -> bool:
                    got = self._claim(table, m, info, need_room=True)
                    if got is not None:
                        cell.append(got)
                    return got is not None

                await self.admission.wait(m, has_room, table.admission_timeout)
                return self._picked(canonical, m, cell[0])
        if on_demand:
            return await self._wait_for_load(canonical, on_demand, info)
        names = ", ".join(f"`{m}`" for m in chain)
        raise ApiError(
            503,
            f"No endpoint can serve {names} right now.",
            "model_unavailable",
            "server_error",
            headers={"Retry-After": "5"},
        )

    def _picked(
        self, canonical: str, served: str, got: tuple[LiveEndpoint, Decision]
    ) -> tuple[LiveEndpoint, str, Decision]:
        if served != canonical:
            self.metrics.fallbacks.labels(canonical, served).inc()
        return got[0], served, got[1]

    def _ask_load(self, model: str) -> None:
        now = self.clock()
        if now - self._load_requested.get(model, -1e18) >= _LOAD_REQUEST_INTERVAL:
            self._load_requested[model] = now
            log.info("asking the controller to load on-demand model %s", model)
            self.controller.request_load(model)

    async def _wait_for_load(
        self, canonical: str, models: list[str], info: RequestInfo
    ) -> tuple[LiveEndpoint, str, Decision]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.on_demand_wait
        while (remaining := deadline - loop.time()) > 0:
            changed = self._snapshot_changed
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                break
            table = self.table
            assert table is not None
            for m in models:
                got = self._claim(table, m, info, need_room=False) if m in table.models else None
                if got is not None:
                    return self._picked(canonical, m, got)
        raise ApiError(
            503,
            f"model is loading: `{models[0]}` has no replica yet; retry in {self.options.loading_retry_after} s.",
            "model_loading",
            "server_error",
            headers={"Retry-After": str(self.options.loading_retry_after)},
        )

    # ------------------------------------------------------------------ accounting

    def _account(self, call: _Call) -> None:
        elapsed = time.monotonic() - call.started
        result = call.result
        prompt = result.prompt_tokens if result and result.prompt_tokens is not None else None
        completion = result.completion_tokens if result and result.completion_tokens is not None else 0
        if prompt is None and result is not None and result.events:
            # A stream cut short (the client left, the engine broke) never got to its usage event, yet the
            # engine did the work: charge the prompt's estimate and a token per event forwarded, rather
            # than nothing (which would make leaving just before the end a way around budgets).
            prompt, completion = call.prompt_estimate, result.events
        elif prompt is None and result is not None and call.status == 200:
            # Answered without `usage` (a provider that omits it, a client gone before the body was read):
            # the estimate reserved for it, not zero, so a missing field is no way around budgets.
            prompt, completion = call.prompt_estimate, call.completion_cap * call.sequences
        m = self.metrics
        m.child(m.requests, call.model, str(call.status), call.code).inc()
        m.child(m.duration, call.model).observe(elapsed)
        if result is not None and result.first_byte_at is not None:
            m.child(m.ttft, call.model).observe(result.first_byte_at - call.started)
        served = call.served or call.model
        if prompt is not None:
            m.observe_tokens(served, prompt, completion)
        used = (prompt if prompt is not None else call.estimate) + completion
        if call.served is None:
            # Refused after admission (queue, no endpoint) before any engine saw it: the reservation, which may
            # be the whole context, is given back rather than spent.
            used = 0
        table = self.table
        prices = table.models[served].prices if table is not None and served in table.models else None
        cost = 0.0
        if prices is not None and prompt is not None:
            cost = (prompt * prices.input_per_million + completion * prices.output_per_million) / 1e6
        if call.lease is not None:
            self.limiter.release(call.lease, used, cost)
        principal = call.principal
        if principal is None or principal.project is None or table is None:
            return
        chain = call.chain
        self.usage.record(
            UsageRecord(
                time=self.clock(),
                request_id=call.request_id,
                project=principal.project,
                model=served,
                status=call.status,
                team=(chain.team or "") if chain else "",
                org=(chain.org or "") if chain else "",
                key_id=principal.key_id,
                tokens_in=prompt or 0,
                tokens_out=completion,
                cost=cost,
                latency_ms=elapsed * 1000,
                fallback_used=served != call.model,
                router_id=self.options.router_id,
            )
        )


# ---------------------------------------------------------------------------------------------- helpers


# A random UUID4 in hex, the same text uuid.uuid4().hex gives, without building a UUID object and from the
# process's PRNG (seeded from the OS at start): a request id must be unique, not unpredictable, and
# os.urandom costs a system call per request.
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def _new_request_id() -> str:
    return f"{random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET:032x}"


_REQUEST_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def _request_id(sent: str | None) -> str:
    """The client's x-request-id when it is a plain token (it goes to the engine, into logs and usage rows),
    else a new one."""
    if sent and len(sent) <= 128 and _REQUEST_ID_CHARS.issuperset(sent):
        return sent
    return _new_request_id()


def _has_tenants(tenants: Tenants) -> bool:
    # A snapshot with no tenants at all (a static router with a keys file) lets every key use every model.
    return bool(tenants.projects or tenants.teams or tenants.organizations)


def _not_ready() -> ApiError:
    return ApiError(
        503,
        "The router has no snapshot yet; retry shortly.",
        "router_not_ready",
        "server_error",
        headers={"Retry-After": "1"},
    )


async def _read_body(request: web.Request, limit: int) -> bytes:
    too_big = ApiError(413, f"Request body larger than {limit} bytes.", "request_too_large")
    if request.content_length is not None:
        if request.content_length > limit:
            raise too_big
        return await request.read()
    buf = bytearray()
    async for chunk in request.content.iter_any():
        buf += chunk
        if len(buf) > limit:
            raise too_big
    return bytes(buf)


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = jsonsafe.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", "invalid_json")
    _check_types(body)
    return body


# Fields the router itself acts on: checked strictly here, because an engine that coerces them differently
# ("stream": "yes" streams in one and not in the other) would answer in a shape the router does not expect,
# and a client's typo must never count as the engine failing (which would open its breaker for everyone).
_TYPED_FIELDS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("stream", (bool,), "a boolean"),
    ("stream_options", (dict,), "an object"),
    ("max_tokens", (int,), "a whole number"),
    ("max_completion_tokens", (int,), "a whole number"),
    # Multiply the reservation: an engine that read "8" as 8 would generate eight times what was reserved.
    ("n", (int,), "a whole number"),
    ("best_of", (int,), "a whole number"),
)


def _check_types(body: dict[str, Any]) -> None:
    for name, types, words in _TYPED_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        wrong = not isinstance(value, types) or (types == (int,) and isinstance(value, bool))
        if wrong or (types == (int,) and value < 0):
            raise ApiError(
                400,
                f"`{name}` must be {words}{' >= 0' if types == (int,) else ''}, got {json.dumps(value)[:40]}.",
                "invalid_type",
                param=name,
            )


# OpenAI's /v1/completions generates 16 tokens when max_tokens is not given (vLLM does the same; llama.cpp would
# run to the end of the context): kept as the cap such a request reserves and is sent.
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _check_context(raw: bytes, body: dict[str, Any], kind: Kind, model: PublishedModel, call: _Call) -> None:
    """Fill in what the request may cost: the prompt's estimate (bytes/4 plus 10%, so an estimate a few
    percent out does not refuse a valid request), the completion per sequence (what the client asked, else
    the model's `max_output_tokens`, else whatever the context leaves after the prompt: what the engine
    would really generate; at most 16 for legacy completions, that API's default), and how many sequences
    (`n`, `best_of`). Raises when it cannot fit."""
    call.prompt_estimate = prompt = int(len(raw) / 4 * 1.1)
    if kind == "embeddings":
        call.completion_asked, call.completion_cap, call.sequences = None, 0, 1
        asked: int | None = None
    else:
        asked = _asked(body)
        call.completion_asked = asked
        call.sequences = max([1, *(v for k in ("n", "best_of") if isinstance(v := body.get(k), int))])
        cap = model.max_output_tokens
        if asked is not None and cap is not None and asked > cap:
            raise ApiError(
                400,
                f"max_tokens is {asked}, but this model generates at most {cap} tokens per request; "
                f"ask for {cap} or fewer.",
                "max_tokens_too_large",
                param="max_tokens",
            )
        room = model.context_length - prompt
        if asked is not None:
            call.completion_cap = asked
        else:
            limits = [room, *(() if cap is None else (cap,))]
            if kind == "completions":  # the legacy API's documented default, which clients rely on
                limits.append(_COMPLETIONS_DEFAULT_MAX_TOKENS)
            call.completion_cap = min(limits)
    completion = call.completion_cap
    if prompt + completion > model.context_length or (
        asked is None and kind != "embeddings" and completion < 1
    ):
        raise ApiError(
            400,
            f"This model's maximum context length is {model.context_length} tokens, but the request needs about "
            f"{prompt + max(completion, 1)} ({prompt} estimated for the prompt, {max(completion, 1)} for the "
            f"completion). Shorten the messages or lower max_tokens.",
            "context_length_exceeded",
            param="messages",
        )


def _asked(body: dict[str, Any]) -> int | None:
    """The completion length the client asked for (either spelling; types were checked), None when unset."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int):
            return value
    return None


def _fits(model: PublishedModel, call: _Call) -> bool:
    """May `model` serve this request as a fallback: does its context hold the prompt and what was asked?"""
    room = model.context_length - call.prompt_estimate
    asked = call.completion_asked
    if asked is None:  # sent a cap of its own (at least one token), or an embedding (no completion)
        return room >= (1 if call.completion_cap else 0)
    return asked <= room and (model.max_output_tokens is None or asked <= model.max_output_tokens)


def _sent_cap(model: PublishedModel | None, call: _Call, provider: bool) -> int | None:
    """The max_tokens to send to an engine of `model` for a request that set none (None: send nothing): the
    reserved cap, lowered to what the serving model's context and own cap allow, never raised (the
    reservation was made for the requested model).

    Not sent when the context is what binds and a replica serves: the agent starts engines with the model's
    `context_length` as their limit, so prompt plus completion already stops there, which is exactly what was
    reserved (the prompt's estimate plus the rest of the context); and a number derived from the estimate
    would make vLLM refuse every prompt the estimate under-counts (text in scripts of three UTF-8 bytes per
    token). A provider's real context is not ours to know, so it is always sent the cap."""
    if call.completion_asked is not None or model is None:
        return None
    room = model.context_length - call.prompt_estimate
    cap = min(call.completion_cap, room)
    if model.max_output_tokens is not None:
        cap = min(cap, model.max_output_tokens)
    if cap >= room and not provider:
        return None
    return max(cap, 1)


def _session_key(request: web.Request, body: dict[str, Any], policy: Any) -> str | None:
    if policy.weights.session <= 0:
        return None
    settings = policy.session
    header = request.headers.get(settings.header)
    if header:
        return str(header)
    user = body.get("user")
    if settings.use_user_field and isinstance(user, str) and user:
        return "user:" + user
    head = body.get("messages") or body.get("prompt")
    if isinstance(head, list):
        head = head[: settings.prefix_messages]
    if head is None:
        return None
    return "head:" + hashlib.blake2b(json.dumps(head, sort_keys=True).encode(), digest_size=12).hexdigest()
