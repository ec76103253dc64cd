"""The aiohttp applications: the OpenAI API and, on its own listener, the metrics. An app factory, state under
typed AppKeys, every background loop started and cancelled in cleanup_ctx; no singletons."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmgw.adapters.httplog import quiet_bad_requests
from llmgw_router.auth import Authenticator, KeyStore, StoreKeys
from llmgw_router.egress import client_connector
from llmgw_router.http1 import EngineClient
from llmgw_router.link import ControllerLink, controller_url
from llmgw_router.options import RouterOptions
from llmgw_router.ports import UsageSink
from llmgw_router.ratelimit import Limiter, TenantLimiter, memory_limiter
from llmgw_router.scrape import scrape_loop
from llmgw_router.service import Kind, RequestService

__all__ = ["ROUTER", "BuiltRouter", "Listeners", "build_router", "create_app", "create_metrics_app", "serve"]

log = logging.getLogger(__name__)

ROUTER = web.AppKey("router", RequestService)
LINK = web.AppKey("link", ControllerLink)
_TASKS = web.AppKey("tasks", list)


def _handler(kind: Kind) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await request.app[ROUTER].handle(request, kind)

    return handle


async def _models(request: web.Request) -> web.Response:
    return await request.app[ROUTER].models(request)


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    if router.table is None:
        return web.json_response({"status": "waiting for a snapshot"}, status=503)
    return web.json_response({"status": "ready", "revision": router.table.snapshot.revision})


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    router = app[ROUTER]
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
        if app.get(_SCRAPE, True):
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
        link = app.get(LINK)
        if link is not None:
            tasks.append(asyncio.create_task(link.run(session)))
        app[_TASKS] = tasks
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        router.session = None
        router.engines.close()
        router.engines = None


_SCRAPE = web.AppKey("scrape", bool)


def create_app(
    router: RequestService, link: ControllerLink | None = None, scrape: bool = True
) -> web.Application:
    # The body limit is enforced by the request path from the snapshot's max_body_bytes; aiohttp's own
    # limit only matters for request.read(), which the router does not use.
    app = web.Application(client_max_size=1 << 40)
    app[ROUTER] = router
    app[_SCRAPE] = scrape
    if link is not None:
        app[LINK] = link
    app.cleanup_ctx.append(_client_session)
    app.router.add_post("/v1/chat/completions", _handler("chat"))
    app.router.add_post("/v1/completions", _handler("completions"))
    app.router.add_post("/v1/embeddings", _handler("embeddings"))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    return app


def create_metrics_app(router: RequestService) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(router.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclass
class Listeners:
    """What `serve` bound: the ports actually in use (useful with port 0) and a way to stop."""

    api_port: int
    metrics_port: int
    runners: list[web.AppRunner]

    async def close(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


async def serve(
    router: RequestService,
    listen: str,
    metrics_listen: str,
    link: ControllerLink | None = None,
    scrape: bool = True,
    *,
    api_socket: socket.socket | None = None,
    metrics_socket: socket.socket | None = None,
) -> Listeners:
    """Start the API and metrics listeners. A client that goes away cancels its handler (and so the upstream
    request): handler_cancellation is on. `api_socket` / `metrics_socket`: already bound and listening
    sockets to serve on instead of binding `listen` / `metrics_listen` (a worker's SO_REUSEPORT socket)."""
    quiet_bad_requests()  # a malformed request is one warning line, not an ERROR traceback per attempt
    api = web.AppRunner(create_app(router, link, scrape), handler_cancellation=True, access_log=None)
    met = web.AppRunner(create_metrics_app(router), access_log=None)
    ports = []
    for runner, address, given in ((api, listen, api_socket), (met, metrics_listen, metrics_socket)):
        await runner.setup()
        host, port = _split(address)
        site: web.BaseSite = (
            web.TCPSite(runner, host, port, backlog=1024)
            if given is None
            else web.SockSite(runner, given, backlog=1024)
        )
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        ports.append(sockets[0].getsockname()[1] if sockets else port)
    log.info(
        "router API on %s:%d, metrics on %s:%d",
        _split(listen)[0],
        ports[0],
        _split(metrics_listen)[0],
        ports[1],
    )
    return Listeners(ports[0], ports[1], [api, met])


@dataclass
class BuiltRouter:
    """What `build_router` made: the request service and, when there are controllers, the link to them
    (pass both to `serve`)."""

    service: RequestService
    link: ControllerLink | None


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
) -> BuiltRouter:
    """The one assembly of a router, for `llmgw-router` and `llmgw up`. With a `store` DSN: keys, pooled
    limits and usage from it (opened and closed on `stack`); without one, `keys` (a keys file, or None for no
    authentication) and limits in memory. With `controllers`: the link that feeds snapshots and takes load
    requests. ValueError when the usage spool cannot be used."""
    limiter: Limiter = memory_limiter(limits_clock)
    usage: UsageSink | None = None
    pending: Callable[[], float] | None = None
    if store is not None:
        from llmgw.store.grace_ledger import GraceLedger
        from llmgw.store.limiter import Limiter as PoolLimiter
        from llmgw.store.slots import PooledSlots, holder_id
        from llmgw.store.store import Store
        from llmgw.store.usage_spool import SpoolError
        from llmgw.store.usage_writer import UsageWriter

        opened = await Store.open(store)
        stack.push_async_callback(opened.close)
        keys = StoreKeys(opened)
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
        usage = writer
        pending = lambda: writer.stats.pending  # noqa: E731
    service = RequestService(options, Authenticator(keys), limiter, usage)
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
        )
        service.controller = link
    return BuiltRouter(service, link)
