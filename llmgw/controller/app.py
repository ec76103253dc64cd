"""The controller's aiohttp app factory and the in-process entry points.

`start_controller(settings)` starts everything (store, listeners, the source, reconcile and liveness loops)
and returns a handle; `llmgw controller` and `llmgw up` both use it. Every background loop lives in the app's
cleanup_ctx, so stopping the runner stops them all; no globals.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from llmgw_agent.protocol import AGENT_PATH

from llmgw.adapters.commit_status import CommitStatusError, StatusPoster, read_token
from llmgw.adapters.httplog import quiet_bad_requests
from llmgw.adapters.mirror import mirror_app
from llmgw.adapters.sources import DirectorySource, GitSource, RevisionSource, SourceUnavailable
from llmgw.adapters.tracing import configured_endpoint, otlp_tracer
from llmgw.controller import console
from llmgw.controller.api import (
    admin,
    audited,
    capacity as capacity_admin,
    doctor,
    evals as admin_evals,
    fleet as admin_fleet,
    guard,
    logs as logs_admin,
    prom_sd,
    request_lookup as admin_requests,
    routes as admin_routes,
    upgrades,
    usage_summary as usage_summary_admin,
)
from llmgw.controller.api.people import access as people_access
from llmgw.controller.core import CONTROLLER, Controller, admin_token_from
from llmgw.controller.loops.auto_checks import auto_check_loop
from llmgw.controller.loops.canary import canary_loop
from llmgw.controller.loops.commit_statuses import CommitStatuses
from llmgw.controller.loops.notifier import Notifier
from llmgw.controller.loops.peers import PeerWatch
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.loops.retention import Retention
from llmgw.controller.loops.update_checks import UPDATE_CHECKS, UpdateChecks
from llmgw.controller.parts import lease
from llmgw.controller.parts.admin_tokens import AdminTokens
from llmgw.controller.parts.credentials import loopback_address
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.parts.settings import ControllerOptions, parse_hostport
from llmgw.controller.parts.state import SeenRevision
from llmgw.controller.status import fleet as views
from llmgw.controller.wire.publisher import SnapshotCache, router_stream
from llmgw.core.errors import Outage, retry_after
from llmgw.store.errors import StoreError
from llmgw.store.store import Store

log = logging.getLogger("llmgw.controller")

SOURCE = admin.SOURCE
STARTS_GRACE_S = 10.0  # how long a stopping controller waits for its pass under way and the starts it sent
RECONCILER: web.AppKey[Reconciler] = web.AppKey("reconciler", Reconciler)
NOTIFIER: web.AppKey[Notifier] = web.AppKey("notifier", Notifier)
RETENTION: web.AppKey[Retention] = web.AppKey("retention", Retention)
ROUTER_PATH = "/router/v1"
EXPIRE_EVERY_S = 0.5


def make_source(settings: ControllerOptions) -> RevisionSource:
    if settings.source_kind() == "git":
        return GitSource(
            settings.repo, settings.branch, settings.subpath, settings.state_dir, settings.poll_s
        )
    root = Path(settings.repo).expanduser() / settings.subpath
    return DirectorySource(root, settings.dir_poll_s)


def make_app(controller: Controller, source: RevisionSource) -> web.Application:
    app = web.Application(client_max_size=32 * 1024 * 1024)
    app[CONTROLLER] = controller
    app[guard.TOKENS] = controller  # who holds the admin tokens the route table's check asks
    # Handlers given only the parts they read, each under its module's key, typed as the protocol naming them.
    app[prom_sd.PARTS] = controller
    app[doctor.PARTS] = controller
    app[logs_admin.PARTS] = controller
    app[admin_evals.PARTS] = controller
    app[admin_fleet.PARTS] = controller
    app[upgrades.PARTS] = controller
    app[audited.PARTS] = controller
    app[capacity_admin.PARTS] = controller
    app[admin_requests.PARTS] = controller
    app[usage_summary_admin.PARTS] = controller
    app[people_access.PARTS] = controller
    app[guard.PEOPLE] = people_access.KeyPeople(
        controller
    )  # whose own key a token is, on the routes people call
    app[admin.POLL_NOW] = asyncio.Event()
    app[SOURCE] = source
    reconciler = app[RECONCILER] = Reconciler(controller)
    controller.hub.on_register = reconciler.adopt  # agents' running shards are adopted, never restarted
    notifier = app[NOTIFIER] = Notifier(controller)
    controller.event_hooks.append(notifier.controller_event)
    settings = controller.settings
    if settings.commit_status_url is not None:  # the token is read here, at the edge, once
        if settings.commit_status_token_file is None:
            raise CommitStatusError("commit_status_url needs commit_status_token_file (the forge token)")
        poster = StatusPoster(settings.commit_status_url, read_token(settings.commit_status_token_file))
        statuses = CommitStatuses(controller, poster)
        controller.event_hooks.append(statuses.on_event)
        app.cleanup_ctx.append(_background("commit-statuses", lambda a: statuses.run()))
    app.router.add_get(AGENT_PATH, controller.hub.handle)
    snapshots = SnapshotCache()  # one build per change for all routers
    controller.change_listeners.append(snapshots.invalidate)
    app.router.add_get(ROUTER_PATH, functools.partial(router_stream, c=controller, snapshots=snapshots))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/healthz/leader", _healthz_leader)
    admin_routes.add_routes(app)
    console.add_routes(app, controller)
    if controller.lease is not None:
        app.middlewares.append(
            lease.standby_middleware(controller.lease, ROUTER_PATH, controller.router_token_ok)
        )
    app.cleanup_ctx.append(_background("source", _source_loop))
    app.cleanup_ctx.append(_reconcile_ctx)
    app.cleanup_ctx.append(_background("liveness", _liveness_loop))
    app.cleanup_ctx.append(_nodes_ctx)
    app.cleanup_ctx.append(_background("notifier", lambda a: a[NOTIFIER].run()))
    app.cleanup_ctx.append(_background("budgets", lambda a: a[NOTIFIER].budget_loop()))
    retention = app[RETENTION] = Retention(controller)
    app[admin_requests.VAULT] = retention.vault  # kept bodies: `llmgw request ID --body` and `--replay`
    app[admin_requests.REPLAY_PARTS] = controller
    app.cleanup_ctx.append(_background("retention", lambda a: retention.run()))
    _add_checks(app, controller)
    return app


def _add_checks(app: web.Application, controller: Controller) -> None:
    """The loops that judge what is running or offered against what it should be: canaries, model checks,
    new weights upstream, the peers."""
    app.cleanup_ctx.append(_background("canary", lambda a: canary_loop(a[CONTROLLER])))
    app.cleanup_ctx.append(_background("model-checks", lambda a: auto_check_loop(a[CONTROLLER])))
    update_checks = app[UPDATE_CHECKS] = UpdateChecks(controller)
    app.cleanup_ctx.append(_background("update-checks", lambda a: update_checks.run()))
    peers = PeerWatch(controller)
    app.cleanup_ctx.append(_background("peers", lambda a: peers.run()))


def make_metrics_app(controller: Controller) -> web.Application:
    app = web.Application()

    async def metrics(_: web.Request) -> web.Response:
        refresh_metrics(controller)
        return web.Response(body=controller.metrics.render(), content_type="text/plain", charset="utf-8")

    app.router.add_get("/metrics", metrics)
    return app


async def _healthz(request: web.Request) -> web.Response:
    """Liveness only, with no token (for load balancers and probes): the applied revision and the role are
    in the authenticated `/api/v1/status`. A load balancer that must send traffic to the leader only asks
    `/healthz/leader` (200 leading, 503 standing by), which says no more than that one bit."""
    return web.json_response({"ok": True})


async def _healthz_leader(request: web.Request) -> web.Response:
    c = request.app[CONTROLLER]
    leading = c.leading()
    return web.json_response({"ok": leading}, status=200 if leading else 503)


Loop = Callable[[web.Application], Coroutine[Any, Any, None]]


def _background(name: str, loop: Loop) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(loop(app), name=f"llmgw-controller-{name}")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx


async def _source_loop(app: web.Application) -> None:
    c = app[CONTROLLER]
    source = app[SOURCE]
    poll_now = app[admin.POLL_NOW]
    loop = asyncio.get_running_loop()
    # A webhook asks for a poll sooner, never more often than this: a flood of them is one poll per gap.
    gap = min(c.settings.webhook_min_interval_s, source.interval_s)
    bug = Outage(log, f"polling {source.description}")
    while True:
        polled_at = loop.time()
        c.metrics.source_polls.inc()
        wait = source.interval_s
        try:
            checkout = await source.poll()
            c.metrics.source_up.set(1)
            await c.offer(checkout)
            c.polled = SeenRevision(checkout.revision, checkout.where, c.wall())
            bug.recovered()
        except SourceUnavailable as exc:  # said once per message by set_source_error
            c.metrics.source_up.set(0)
            c.set_source_error(str(exc))
            wait = retry_after(exc, default=source.interval_s, most=source.interval_s)
        except Exception as exc:  # a bug here must not stop the controller following the repo
            bug.failed(exc, wait)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await poll_now.wait()
        early = polled_at + gap - loop.time()
        if poll_now.is_set() and early > 0:
            await asyncio.sleep(early)  # webhooks arriving meanwhile are folded into the one poll below
        poll_now.clear()


async def _reconcile_ctx(app: web.Application) -> AsyncIterator[None]:
    reconciler = app[RECONCILER]
    task = asyncio.get_running_loop().create_task(reconciler.run(), name="llmgw-controller-reconcile")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await reconciler.close()  # commands in flight (starts, drains, stops) end with it


async def _nodes_ctx(app: web.Application) -> AsyncIterator[None]:
    """SSH bootstrap of the repo's remote Nodes and teardown of removed ones (llmgw.controller.loops.nodes)."""
    from llmgw.controller.loops.nodes import NodesLoop  # asyncssh and the bootstrap steps: loaded only here

    nodes = NodesLoop(app[CONTROLLER], app[RECONCILER].drain_node)
    task = asyncio.get_running_loop().create_task(nodes.run(), name="llmgw-controller-nodes")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await nodes.close()  # bootstraps and teardowns in flight end with it


async def _liveness_loop(app: web.Application) -> None:
    c = app[CONTROLLER]
    while True:
        for name, state in c.hub.expire():
            if state == "Lost" and c.leading():
                await c.event("node_lost", name, "no heartbeat from its agent for lost_after")
        c.metrics.agent_connections.set(sum(1 for n in c.hub.nodes.values() if n.connected))
        await asyncio.sleep(EXPIRE_EVERY_S)


def refresh_metrics(c: Controller) -> None:
    """State gauges recomputed from the controller at scrape time."""
    m = c.metrics
    m.revision_applied_info.clear()
    if c.desired is not None:
        m.revision_applied_info.labels(c.desired.revision).set(1)
    m.sync_status.clear()
    m.sync_status.labels(c.sync_status()).set(1)
    for state in ("Ready", "Unreachable", "Lost"):
        m.nodes.labels(state).set(sum(1 for n in c.hub.nodes.values() if n.state == state))
    m.replicas.clear()
    counts: dict[tuple[str, str], int] = {}
    for rec in c.replicas.values():
        key = (rec.model, views.replica_state(c, rec))
        counts[key] = counts.get(key, 0) + 1
    for (model, state), n in counts.items():
        m.replicas.labels(model, state).set(n)
    m.model_health.clear()
    if c.desired is not None:
        for name in c.desired.models:
            m.model_health.labels(name, views.model_health(c, name)["health"]).set(1)
    m.autoscale_desired.clear()
    m.model_load.clear()
    for name, record in c.worker_state.models.items():
        if record.scaled is not None:
            m.autoscale_desired.labels(name).set(record.scaled.desired)
    for name, demand in c.worker_state.model_demand().items():
        for kind, value in (
            ("queued", demand.queued),
            ("inflight", demand.inflight),
            ("refused", demand.refused),
        ):
            m.model_load.labels(name, kind).set(value)
    m.gpus.clear()
    for link in c.hub.nodes.values():
        taken = {g for r in c.replicas.values() if r.node == link.name for g in r.gpus}
        for gpu in link.inventory.gpus or []:
            allocated = "true" if gpu.index in taken else "false"
            m.gpus.labels(link.name, gpu.gpu_class or "unknown", allocated).inc()
    m.agent_connections.set(sum(1 for n in c.hub.nodes.values() if n.connected))
    m.node_clock_offset.clear()  # connected nodes only: a silent node's last reading is not its clock now
    for link in c.hub.nodes.values():
        offset = link.clock_offset
        if link.connected and offset is not None:
            m.node_clock_offset.labels(link.name).set(offset)
    # From the same records as the admin API, so the two never disagree; a standby's view of the nodes is not
    # the cluster's, so it reports none.
    m.node_bootstrap.clear()
    if c.leading():
        for name, op in c.nodes.all_ops().items():
            if op.removal is None:
                m.node_bootstrap.labels(name, op.state).set(1)


PeerCheck = Callable[[bytes | None], str]


def router_tls_check(settings: ControllerOptions) -> PeerCheck | None:
    """With the cluster CA: the check `/router/v1` makes of a router's client certificate (its role)."""
    if settings.ca_dir is None:
        return None
    from llmgw.adapters.ssh.ca import ClusterCA

    ca = ClusterCA.open(settings.ca_dir, create=False)
    return ca.check_router


def tls_setup(
    settings: ControllerOptions,
) -> tuple[ssl.SSLContext | None, PeerCheck | None]:
    """The listener's TLS context and, with mutual TLS, the check that names the node a certificate proves.

    Client certificates are optional at the TLS layer so the admin API works without one; the agent endpoint
    refuses an agent without a valid one (and one whose certificate names another node), and with the
    cluster CA the router stream refuses a client without a router's certificate."""
    if settings.ca_dir is not None:
        from llmgw.adapters.ssh.ca import ClusterCA

        ca = ClusterCA.open(settings.ca_dir, create=settings.ca_dir == default_ca_dir(settings))
        ctx = ca.server_context([settings.listen])
        ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx, lambda der: ca.check_peer(der).node
    if settings.tls_cert is None:
        return None, None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None)
    if settings.tls_client_ca is None:
        return ctx, None
    ctx.load_verify_locations(str(settings.tls_client_ca))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx, _certificate_node


def _certificate_node(der: bytes | None) -> str:
    """The node a client certificate names (its CN); the chain was verified in the handshake."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    if not der:
        raise ValueError("no client certificate presented")
    names = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ValueError("the certificate names no node (no CN)")
    return str(names[0].value)


@dataclass
class RunningController:
    """A started controller: its URLs, admin token and the object itself (for `llmgw up` and tests)."""

    controller: Controller
    url: str
    metrics_url: str | None
    admin_token: str
    _runners: list[web.AppRunner]
    _lease_task: asyncio.Task[None] | None = None

    @property
    def console(self) -> console.ConsoleState:
        """The web console of the controller's app (its sessions, the router its chat page uses)."""
        return self._runners[0].app[console.CONSOLE]

    @property
    def notifier(self) -> Notifier:
        """The webhook sender of the controller's app (the first runner's)."""
        return self._runners[0].app[NOTIFIER]

    async def stop(self) -> None:
        if self._lease_task is not None and self.controller.lease is not None:
            # Give the lease up first, so a standby leads at its next try rather than after the ttl.
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
            await self.controller.lease.release()
        # The pass under way ends and its starts reach their agents before the links close: a start cut off
        # would leave a replica in the store that never ran, and the next leader would start another.
        await self._runners[0].app[RECONCILER].finish_in_flight(STARTS_GRACE_S)
        # Open WebSockets first: the runner would otherwise wait for them to end on their own.
        await self.controller.hub.close()
        for ws in list(self.controller.router_sockets):
            await ws.close()
        for runner in reversed(self._runners):
            await runner.cleanup()
        await self.controller.stop_background()
        await self.controller.store.close()
        if self.controller.trace_shutdown is not None:
            await asyncio.to_thread(self.controller.trace_shutdown)  # the last spans, flushed off the loop


def default_ca_dir(settings: ControllerOptions) -> Path:
    return settings.state_dir / "ca"


def repo_remote_nodes(settings: ControllerOptions) -> tuple[str, list[str]] | None:
    """The controller address and the remote Nodes of the repo as it is on disk now (a local repo, or the
    clone an earlier run left in the state dir); None when it cannot be read yet."""
    from llmgw.adapters.repo_files import load_repo

    local = settings.local_repo()
    if local is None:
        clone = GitSource(settings.repo, settings.branch, settings.subpath, settings.state_dir, 1.0).clone_dir
        local = clone if clone.is_dir() else None
    if local is None:
        return None
    catalog = load_repo(local / settings.subpath).catalog
    if catalog is None:
        return None
    remote = sorted(n for n, e in catalog.nodes.items() if not e.spec.local)
    return catalog.cluster.controller.address, remote


def with_default_ca(settings: ControllerOptions) -> ControllerOptions:
    """Remote nodes default to mutual TLS: with no CA and no TLS of its own, a controller whose repo declares
    remote Nodes dialling a non-loopback address uses (creating it the first time) the CA in STATE_DIR/ca.
    Without it their agents would send their token in clear and take commands from whoever answers."""
    if settings.ca_dir is not None:
        return settings
    if settings.insecure_token_only_remote_nodes:
        log.warning(
            "INSECURE: insecure_token_only_remote_nodes is set: remote nodes get no certificates and their "
            "agents dial this controller with a bearer token in clear; anyone on the path can read it and "
            "pose as the controller"
        )
        return settings
    if settings.tls_cert is not None or not settings.default_ca:
        return settings
    found = repo_remote_nodes(settings)
    if found is None or not found[1] or loopback_address(found[0]):
        return settings
    ca_dir = default_ca_dir(settings)
    log.info(
        "the repo declares remote nodes (%s) dialling %s: mutual TLS with the cluster CA in %s",
        ", ".join(found[1]),
        found[0],
        ca_dir,
    )
    return settings.model_copy(update={"ca_dir": ca_dir})


async def start_controller(settings: ControllerOptions) -> RunningController:
    """Open the store, start listeners and loops; returns once the listeners are bound."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    settings = with_default_ca(settings)
    token = admin_token_from(settings)
    tokens = AdminTokens.load(token, settings.admin_tokens_file)
    ctx, peer_check = tls_setup(settings)
    store = await Store.open(settings.store)
    controller = Controller(
        settings, store, ControllerMetrics(), admin_token=token, admin_tokens=tokens, peer_check=peer_check
    )
    controller.router_peer_check = router_tls_check(settings)
    endpoint = configured_endpoint(settings.otlp_endpoint)
    if endpoint is not None:
        # Imported only now: a controller without an endpoint never loads OpenTelemetry.
        from llmgw.controller.parts.tracing import CommitTracer

        tracer, controller.trace_shutdown = otlp_tracer(
            "llmgw-controller", endpoint, sample=settings.trace_sample
        )
        controller.commit_tracer = CommitTracer(tracer)
    ws = controller.worker_state
    ws.settle_until = controller.clock() + settings.settle_s
    await controller.load_earlier_state()
    try:
        last = await store.last_accepted_revision()
        if last is not None:
            log.info("last applied revision in the store: %s from %s", last.sha[:12], last.source)
    except StoreError as exc:
        log.warning("could not read the revision history from the store: %s", exc)
    runners: list[web.AppRunner] = []
    try:
        app = make_app(controller, make_source(settings))
        url = await _serve(app, settings.listen_hostport, ctx, runners)
        metrics_url = None
        if settings.metrics_hostport is not None:
            metrics_url = await _serve(make_metrics_app(controller), settings.metrics_hostport, None, runners)
            bound = urlsplit(metrics_url)
            if bound.hostname is not None and bound.port is not None:
                controller.metrics_address = (bound.hostname, bound.port)
        if settings.mirror_dir is not None:
            # Its own listener: every node pulls gigabytes from it, and the admin port must stay closeable. Plain
            # HTTP: agents' weights sessions present no client certificate; every file is checked by sha256.
            mirror_at = parse_hostport(settings.mirror_listen, "--mirror-listen")
            app_ = mirror_app(settings.mirror_dir, controller.mirror_reader)
            log.info("mirror of %s on %s", settings.mirror_dir, await _serve(app_, mirror_at, None, runners))
    except BaseException:
        for runner in reversed(runners):
            await runner.cleanup()
        await store.close()
        raise
    log.info("controller listening on %s (metrics %s)", url, metrics_url or "off")
    lease_task = None
    if controller.lease is not None:
        controller.lease.set_address(settings.advertise or url)
        lease_task = asyncio.get_running_loop().create_task(
            controller.lease.run(), name="llmgw-controller-lease"
        )
    return RunningController(controller, url, metrics_url, token, runners, lease_task)


async def _serve(
    app: web.Application, hostport: tuple[str, int], ctx: ssl.SSLContext | None, runners: list[web.AppRunner]
) -> str:
    quiet_bad_requests()  # a malformed request is one warning line, not an ERROR traceback per attempt
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    await runner.setup()
    runners.append(runner)
    site = web.TCPSite(runner, hostport[0], hostport[1], ssl_context=ctx)
    await site.start()
    host, port = runner.addresses[0][:2]
    scheme = "https" if ctx else "http"
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


async def run_controller(settings: ControllerOptions, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or the task is cancelled); everything started is stopped on the way out."""
    running = await start_controller(settings)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await running.stop()
