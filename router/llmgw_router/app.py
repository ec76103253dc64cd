"""The router's listeners: the OpenAI API on the lean listener (server/listener.py), the metrics on aiohttp; the
background loops (scraping, the controller link) and the engine clients opened with them and closed after.
State lives in the RequestService; no singletons."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmgw.adapters.httplog import quiet_bad_requests
from llmgw.core.snapshot import Tenants
from llmgw.store.queries.request_queries import record_view
from llmgw_router.fleet.kv_events import kv_events_loop
from llmgw_router.fleet.link import ControllerLink, controller_url
from llmgw_router.fleet.ports import UsageSink
from llmgw_router.fleet.scrape import scrape_loop
from llmgw_router.options import RouterOptions
from llmgw_router.path.auth import Authenticator, KeyStore, StoreKeys, is_operator
from llmgw_router.path.ratelimit import Limiter, TenantLimiter, memory_limiter
from llmgw_router.path.service import Kind, RequestService
from llmgw_router.server.exchange import Exchange, json_reply
from llmgw_router.server.listener import ApiListener, Handler
from llmgw_router.server.peers import SnapshotRules
from llmgw_router.surfaces.kept_bodies import BodyKeeper
from llmgw_router.surfaces.messages.exchange import MessagesExchange
from llmgw_router.surfaces.responses.exchange import ResponsesExchange
from llmgw_router.surfaces.responses.keeper import ResponseKeeper, kept_routes
from llmgw_router.upstream.egress import client_connector
from llmgw_router.upstream.http1 import EngineClient

if TYPE_CHECKING:
    from llmgw_router.path.tracing import RequestTracer

__all__ = ["BuiltRouter", "Listeners", "api_routes", "build_router", "create_metrics_app", "serve"]

log = logging.getLogger(__name__)


def api_routes(router: RequestService) -> Mapping[str, Mapping[str, Handler]]:
    """The OpenAI API's paths and methods."""
    keeper = (
        router.kept_responses
    )  # stored responses: built with the service (build_router), before its routes

    def completion(kind: Kind) -> Handler:
        async def handle(exchange: Exchange) -> None:
            await router.handle(exchange, kind)

        return handle

    async def messages(exchange: Exchange) -> None:
        await router.handle(MessagesExchange(exchange), "chat")  # Anthropic's API on the chat path

    async def responses(exchange: Exchange) -> None:
        wrapped = ResponsesExchange(exchange, keeper)
        await router.handle(wrapped, "responses", wrapped.turn)
        await wrapped.flush()  # a stored response is kept before it is sent

    def tenants() -> Tenants | None:
        table = router.table
        return table.snapshot.tenants if table is not None else None

    async def health(exchange: Exchange) -> None:
        exchange.respond(json_reply({"status": "ok"}))

    async def ready(exchange: Exchange) -> None:
        # Anyone (a load balancer) learns ready or not; the revision and the guardrails' setup only an
        # operator's token (L12: an anonymous client learns nothing but that).
        table = router.table
        if router.draining:  # SIGTERM: a load balancer sends new requests elsewhere while these finish
            exchange.respond(json_reply({"status": "draining"}, 503))
        elif table is None:
            exchange.respond(json_reply({"status": "waiting for a snapshot"}, 503))
        elif not is_operator(exchange.headers.get("authorization"), router.options.operator_token):
            exchange.respond(json_reply({"status": "ready"}))
        else:
            guard = {"enabled": table.snapshot.guard.enabled, "guardrails": router.guard.status()}
            exchange.respond(
                json_reply({"status": "ready", "revision": table.snapshot.revision, "guard": guard})
            )

    return {
        "/v1/chat/completions": {"POST": completion("chat")},
        "/v1/completions": {"POST": completion("completions")},
        "/v1/embeddings": {"POST": completion("embeddings")},
        "/v1/messages": {"POST": messages},
        "/v1/responses": {"POST": responses},
        "/v1/responses/*": kept_routes(router.auth, keeper, tenants),  # GET, DELETE a stored response
        "/v1/rerank": {"POST": completion("rerank")},
        "/v1/images/generations": {"POST": completion("images")},
        "/v1/audio/transcriptions": {"POST": completion("transcriptions")},
        "/v1/audio/translations": {"POST": completion("translations")},
        "/v1/score": {"POST": completion("score")},
        "/v1/models": {"GET": router.models},
        "/v1/models/*": {"GET": router.model},  # `*`: the rest of the path, the model's id
        "/health": {"GET": health},
        "/ready": {"GET": ready},
    }


@contextlib.asynccontextmanager
async def _background(
    router: RequestService, link: ControllerLink | None, scrape: bool
) -> AsyncIterator[None]:
    """The clients to engines and providers, the scrape loop and the controller link, for as long as the
    listeners run."""
    opts = router.options
    # Every address is checked as it is connected to (egress.py): a name or numeric form in the snapshot
    # that resolves to a link-local or metadata address is refused there.
    connector = client_connector()
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=opts.connect_timeout, sock_read=opts.read_timeout
    )
    # No cookie jar: a cookie one engine or provider sets must not ride along on other tenants' requests,
    # and filtering an empty jar on every request is work for nothing.
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        router.session = session
        router.engines = EngineClient(
            opts.connect_timeout, opts.read_timeout, request_deadline=opts.request_deadline
        )
        tasks: list[asyncio.Task[None]] = []
        if scrape:
            tasks.append(
                asyncio.create_task(
                    scrape_loop(
                        session,
                        lambda: router.table,
                        router.metrics,
                        router.clock,
                        router.admission.notify_all,
                    )
                )
            )
            prefix = router.forwarding.prefix
            events = kv_events_loop(lambda: router.table, prefix.events, router.clock, prefix.subscribed)
            tasks.append(asyncio.create_task(events))
        if link is not None:
            tasks.append(asyncio.create_task(link.run(session)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            router.session = None
            router.engines.close()
            router.engines = None


def create_metrics_app(router: RequestService) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(router.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def recent_request(request: web.Request) -> web.Response:
        # The router's own buffer of the last requests (llmgw_router.path.lookup): for requests with no usage row
        # (no project's key) or not yet flushed to the store. On the metrics listener, not the API's, and only
        # for the operator's token: a row names the project, the key, the user and the guard verdicts (L12).
        token = router.options.operator_token
        if token is None:
            return _refused(
                403, "this router serves /requests/ID only when started with --operator-token-file"
            )
        if not is_operator(request.headers.get("Authorization"), token):
            return _refused(
                401, "/requests/ID needs `Authorization: Bearer` with the router's operator token"
            )
        found = router.recent.get(request.match_info["request_id"])
        return web.json_response({"requests": [record_view(r) for r in reversed(found)]})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/requests/{request_id}", recent_request)
    return app


def _refused(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclass
class Listeners:
    """What `serve` bound: the ports actually in use (useful with port 0) and a way to stop (the listeners,
    then the background loops and clients)."""

    api_port: int
    metrics_port: int
    api: ApiListener
    stack: contextlib.AsyncExitStack

    async def close(self) -> None:
        await self.stack.aclose()


async def serve(
    router: RequestService,
    listen: str,
    metrics_listen: str,
    link: ControllerLink | None = None,
    scrape: bool = True,
    *,
    api_socket: socket.socket | None = None,
    metrics_socket: socket.socket | None = None,
    drain_timeout: float = 5.0,
    tls: ssl.SSLContext | None = None,
) -> Listeners:
    """Start the background loops, the API listener (on `api_socket` when given: bound already, e.g. a
    worker's SO_REUSEPORT socket; else on `listen`; over TLS with `tls`) and the metrics listener (on
    `metrics_socket`, bound and listening, when given). Closing gives requests in flight `drain_timeout`
    seconds to finish."""
    stack = contextlib.AsyncExitStack()
    try:
        await stack.enter_async_context(_background(router, link, scrape))
        # The metrics listener first: once the API answers /health, everything the router serves is up
        # (a caller that saw /health and asked /metrics at once was refused on a loaded machine), and on
        # close the API drains first while /metrics still answers.
        quiet_bad_requests()  # the metrics listener (aiohttp): a malformed request is one warning line
        met = web.AppRunner(create_metrics_app(router), access_log=None)
        await met.setup()
        stack.push_async_callback(met.cleanup)
        mhost, mport = _split(metrics_listen)
        site: web.BaseSite = (
            web.TCPSite(met, mhost, mport, backlog=128)
            if metrics_socket is None
            else web.SockSite(met, metrics_socket, backlog=128)
        )
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        metrics_port = sockets[0].getsockname()[1] if sockets else mport
        rules = SnapshotRules(lambda: router.table.snapshot.router.listener if router.table else None)
        api = ApiListener(api_routes(router), router.body_limit, rules=rules)
        host, port = _split(listen)
        api_port = await api.start(host, port, api_socket, tls)
        stack.push_async_callback(api.close, drain_timeout)
    except BaseException:
        await stack.aclose()
        raise
    log.info("router API on %s:%d, metrics on %s:%d", host, api_port, mhost, metrics_port)
    return Listeners(api_port, metrics_port, api, stack)


@dataclass
class BuiltRouter:
    """What `build_router` made: the request service and, when there are controllers, the link to them
    (pass both to `serve`)."""

    service: RequestService
    link: ControllerLink | None


async def _on_store(
    stack: contextlib.AsyncExitStack,
    store: str,
    options: RouterOptions,
    limits_clock: Callable[[], float],
    usage_spool: Path | None,
    usage_flush_interval: float,
    grace_ledger: Path | None,
) -> tuple[Any, KeyStore, Limiter, UsageSink, Callable[[], float]]:
    """A router on a store: the store opened, keys, pooled limits and the usage writer from it (each closed
    on `stack`), and what reads the writer's backlog. ValueError when the usage spool cannot be used."""
    from llmgw.store.limits.grace_ledger import GraceLedger
    from llmgw.store.limits.limiter import PoolLimiter
    from llmgw.store.limits.slots import PooledSlots, holder_id
    from llmgw.store.store import Store
    from llmgw.store.usage.usage_spool import SpoolError
    from llmgw.store.usage.usage_writer import UsageWriter

    opened = await Store.open(store)
    stack.push_async_callback(opened.close)
    ledger = GraceLedger(grace_ledger) if grace_ledger is not None else None
    # Concurrency pooled across every router process on this store, like the windowed limits.
    slots = PooledSlots(opened, holder_id(options.router_id), clock=limits_clock)
    await slots.start()
    stack.push_async_callback(slots.close)
    limiter = TenantLimiter(PoolLimiter(opened, clock=limits_clock, grace_ledger=ledger, slots=slots))
    writer = UsageWriter(opened, flush_interval=usage_flush_interval, spool_dir=usage_spool)
    try:
        await writer.start()
    except SpoolError as exc:
        raise ValueError(str(exc)) from None
    stack.push_async_callback(writer.close)
    return opened, StoreKeys(opened), limiter, writer, lambda: writer.stats.pending


def _tracer(stack: contextlib.AsyncExitStack, endpoint: str, sample: float) -> RequestTracer:
    """The request tracer exporting to an OTLP `endpoint`; its last spans flushed when `stack` closes."""
    # Imported here: a router without an endpoint never loads OpenTelemetry (llmgw.adapters.tracing).
    from llmgw.adapters.tracing import otlp_tracer
    from llmgw_router.path.tracing import RequestTracer

    tracer, shutdown = otlp_tracer("llmgw-router", endpoint, sample=sample)
    stack.push_async_callback(asyncio.to_thread, shutdown)  # flushes the last spans, off the loop
    return RequestTracer(tracer)


async def build_router(
    stack: contextlib.AsyncExitStack,
    options: RouterOptions,
    *,
    store: str | None = None,
    keys: KeyStore | None = None,
    controllers: Sequence[str] = (),
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    limits_clock: Callable[[], float] = time.time,
    usage_spool: Path | None = None,
    usage_flush_interval: float = 1.0,
    grace_ledger: Path | None = None,
    content_key: bytes | None = None,
    content_clock: Callable[[], float] = time.time,
) -> BuiltRouter:
    """The one assembly of a router, for `llmgw-router` and `llmgw up`. With a `store` DSN: keys, pooled
    limits and usage from it (opened and closed on `stack`); without one, `keys` (a keys file, or None for no
    authentication) and limits in memory. With `controllers`: the link that feeds snapshots and takes load
    requests. With a `content_key` (and a store): stored responses, sealed under it, their TTLs read on
    `content_clock`. ValueError when the usage spool cannot be used."""
    limiter: Limiter = memory_limiter(limits_clock)
    usage: UsageSink | None = None
    pending: Callable[[], float] | None = None
    opened: Any = None
    if store is not None:
        opened, keys, limiter, usage, pending = await _on_store(
            stack, store, options, limits_clock, usage_spool, usage_flush_interval, grace_ledger
        )
    service = RequestService(options, Authenticator(keys, ttl=options.key_cache_ttl), limiter, usage)
    if content_key is not None:
        if store is None:
            raise ValueError("a content key needs a store (--store DSN): stored responses are kept there")
        from llmgw.store.queries.content import ContentVault

        vault = ContentVault(opened, content_key)
        service.kept_responses = ResponseKeeper(vault, content_clock)
        service.kept_bodies = BodyKeeper(vault, content_clock)  # the same vault keeps request bodies
    if options.otlp_endpoint is not None:
        service.tracer = _tracer(stack, options.otlp_endpoint, options.trace_sample)
    if pending is not None:
        service.metrics.usage_pending.set_function(pending)
    link: ControllerLink | None = None
    if controllers:
        link = ControllerLink(
            [controller_url(a) for a in controllers],
            options.router_id,
            token,
            service.apply_snapshot,
            lambda: dict(service.last_used),
            lambda up: service.metrics.controller_connected.set(1 if up else 0),
            ssl_context=ssl_context,
            load=service.load_report,
        )
        service.controller = link
    return BuiltRouter(service, link)
