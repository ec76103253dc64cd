"""The router stream: routers are told (not asked) the catalog and the ready endpoints on every change.

`/router/v1` is a WebSocket; the controller sends a full snapshot on connect and again whenever its content
changes (a new revision, an endpoint ready or gone). Routers may send `{"type": "usage", "models": [...]}`
(models used since the last message, so idle_timeout knows) and `{"type": "demand", "model": NAME}` on the
same socket; both also exist as HTTP endpoints. `{"type": "load", ...}` (llmgw_router.fleet.load) is each router's
queue, requests in flight, p99 TTFT and refusals per model, and requests in flight per replica: the
autoscaler's demand and what a drain waits on; it is kept per connection and forgotten when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import WSMsgType, web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmgw.adapters.secrets import SecretError
from llmgw.controller.parts.desired import Desired
from llmgw.controller.parts.fleet import FleetReader
from llmgw.controller.parts.hub import AgentHub
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.parts.state import EngineReading, ReplicaLoad, ReplicaRec, RouterLoad
from llmgw.controller.status import fleet as views
from llmgw.controller.status.canaries import live_canaries
from llmgw.core import jsonsafe
from llmgw.core.config.models import LORA_ENGINES, Disaggregation
from llmgw.core.desired.catalog import Catalog
from llmgw.core.errors import LlmgwError
from llmgw.core.evals.model_checks import probes_for
from llmgw.core.fleet.autoscale import Demand, published_load_seconds
from llmgw.core.fleet.federation import peer_models
from llmgw.core.fleet.views import class_rank
from llmgw.core.security import bearer_token, engine_key
from llmgw.core.snapshot import (
    CanaryRoute,
    Endpoint,
    PublishedAdapter,
    PublishedModel,
    PublishedProvider,
    RouterSnapshot,
    Tenants,
)
from llmgw.core.traffic.recorded import trace_salt

log = logging.getLogger("llmgw.controller.wire.publisher")


class SnapshotParts(FleetReader, Protocol):
    """What the routers' snapshot is built from besides a FleetReader: the hub's links (whether the nodes that
    were up are back), the cluster secret (the engine keys, the trace salt) and the names the Cluster's own
    secrets hold."""

    @property
    def hub(self) -> AgentHub: ...

    def cluster_secret(self) -> str: ...

    def reserved_secret_names(self) -> frozenset[str]: ...


class LoadParts(FleetReader, Protocol):
    """What the routers' reports are noted into besides a FleetReader: a change wakes the reconcile worker."""

    def notify(self, why: str = "") -> None: ...


class RouterTokenCheck(Protocol):
    def router_token_ok(self, presented: str) -> bool: ...


class RouterStreamParts(SnapshotParts, LoadParts, RouterTokenCheck, Protocol):
    """What the router stream reads besides the snapshot's and the reports' parts: the router sockets and their
    peers, the change listeners that wake them, the client certificate check and the metrics."""

    @property
    def metrics(self) -> ControllerMetrics: ...

    @property
    def change_listeners(self) -> list[Callable[[], None]]: ...

    @property
    def router_sockets(self) -> set[web.WebSocketResponse]: ...

    @property
    def router_peers(self) -> dict[web.WebSocketResponse, str]: ...

    @property
    def router_peer_check(self) -> Callable[[bytes | None], str] | None: ...


def endpoints(c: SnapshotParts) -> list[Endpoint]:
    """Ready replicas as the router sees them; each carries its engine key (the router holds it, no one else)."""
    d = c.desired
    out: list[Endpoint] = []
    try:
        secret = c.cluster_secret().encode()
    except SecretError as exc:
        log.warning("no endpoints published: %s", exc)
        return out
    canaries = {
        i for ids in live_canaries(c.desired, c.fleet.replicas, c.fleet.canaries).values() for i in ids
    }
    for rec in sorted(c.fleet.replicas.values(), key=lambda r: r.id):
        shard = views.shard_status(c, rec)
        if shard is None or shard.state != "ready" or rec.stopping or shard.base_url is None:
            continue
        # `unknown` is a ready replica on an Unreachable node: its agent is silent, not necessarily its engine.
        # Routers keep it (they see the engine themselves: scrapes and the breaker) until the node is Lost.
        if views.replica_state(c, rec) not in ("ready", "unknown"):
            continue
        entry = d.models.get(rec.model) if d else None
        profile = entry.profile(rec.profile) if entry else None
        version = views.engine_version_of(c, rec.id)
        verified, failed = c.fleet.model_checks.probes_of(rec.model, shard.engine, version)
        probes = probes_for(entry.spec.effective_capabilities) if entry else []
        out.append(
            Endpoint(
                replica_id=rec.id,
                model=rec.model,
                engine=shard.engine,
                base_url=shard.base_url,
                metrics_path=shard.metrics_path,
                api_key=engine_key(secret, rec.id),
                weight=profile.profile.weight if profile else 1.0,
                slots=profile.profile.slots if profile else None,
                simulated=shard.engine == "sim",
                adapters=_carried(d, rec) if d is not None and shard.engine in LORA_ENGINES else [],
                canary=rec.id in canaries,
                verified=verified,
                failed=failed,
                failed_details=c.fleet.model_checks.details_of(rec.model, shard.engine, version),
                checking=c.fleet.model_checks.checking(rec.model, shard.engine, version, probes),
                kv_events=kv_events_address(shard.base_url, shard.kv_events_path),
            )
        )
    return out


def kv_events_address(base_url: str | None, path: str | None) -> str | None:
    """Where routers read a replica's KV events: the relay path its agent reports, on the serving port, behind
    the engine key. None when it relays none (not asked for, an engine without a publisher, or an agent that
    predates the relay: its publisher sits open on the serving address and no router subscribes to it)."""
    if base_url is None or path is None:
        return None
    return base_url.rstrip("/") + path


def snapshot(c: SnapshotParts) -> RouterSnapshot | None:
    d = c.desired
    if d is None:
        return None
    cat = d.catalog
    mappings = {k: v.metrics for k, v in cat.cluster.engines.items() if v.metrics is not None}
    models = published_models(cat)
    models |= peer_models(cat.cluster.peers, c.fleet.peers, cat.peer_fallbacks())  # PEER/MODEL (Federation)
    for name, count in starting_replicas(c).items():
        if name in models:
            models[name] = models[name].model_copy(update={"starting": count})
    for name, rec in c.fleet.worker_state.models.items():
        load_s = published_load_seconds(rec.load_times, rec.bench_load_s)
        if load_s is not None and name in models:
            models[name] = models[name].model_copy(update={"load_seconds": round(load_s, 1)})
    if cat.cluster.classes:  # the admission band: placement's rank, so both agree on who comes first
        for name, entry in cat.models.items():
            if name in models:
                rank = class_rank(cat.cluster.classes, entry.spec.model_class)
                models[name] = models[name].model_copy(update={"class_rank": rank})
    for name in live_canaries(c.desired, c.fleet.replicas, c.fleet.canaries):
        spec = cat.models[name].spec.rollout.canary if name in cat.models else None
        if spec is not None and name in models:
            route = CanaryRoute(weight=spec.weight or 0, header=spec.header)
            models[name] = models[name].model_copy(update={"canary": route})
    return RouterSnapshot(
        revision=d.revision,
        cluster=cat.cluster_name,
        router=cat.cluster.router,
        models=models,
        policies=dict(cat.policies),
        tenants=published_tenants(cat),
        endpoints=endpoints(c),
        metric_mappings=mappings,
        trace_salt=_trace_salt(c),
        reserved_secrets=sorted(c.reserved_secret_names()),
        guard=cat.published_guard(),
        adapters={
            name: PublishedAdapter(base=a.base, projects=a.projects, scale=a.scale, path=a.source.path)
            for name, a in cat.adapters.items()
        },
    )


def _trace_salt(c: SnapshotParts) -> str | None:
    try:
        return trace_salt(c.cluster_secret().encode())
    except SecretError:
        return None  # said once already, where the endpoints are published without keys


def _carried(d: Desired, rec: ReplicaRec) -> list[str]:
    """The adapters a replica loaded at start: its model's, while it runs the profile's current fingerprint
    (which covers the adapter set); a replica started with another set is said to carry none, so no request
    is sent to it for an adapter its engine may number otherwise."""
    if not rec.fingerprint or d.fingerprint(rec.model, rec.profile) != rec.fingerprint:
        return []
    return [name for name, _ in d.catalog.adapters_of(rec.model)]


def starting_replicas(c: FleetReader) -> dict[str, int]:
    """Replicas on their way per model (placed, not ready yet, not stopping): a router holds a busy or
    replica-less model's requests for them instead of refusing at once."""
    counts: dict[str, int] = {}
    for rec in c.fleet.replicas.values():
        if not rec.stopping and views.replica_state(c, rec) in ("pending", "starting"):
            counts[rec.model] = counts.get(rec.model, 0) + 1
    return counts


def published_models(cat: Catalog) -> dict[str, PublishedModel]:
    """The models as routers see them: every decision that needs the whole repo (the fallback chain,
    whether a model loads on demand) made here, so routers only follow it."""
    return {
        name: PublishedModel(
            aliases=list(m.aliases),
            context_length=m.spec.context_length,
            capabilities=m.spec.effective_capabilities,
            without=list(m.spec.without),
            verified_only=cat.cluster.verified_only if m.spec.verified_only is None else m.spec.verified_only,
            prices=m.spec.prices,
            max_output_tokens=m.spec.max_output_tokens,
            # Resolved here, once: aliases to names, transitively. Routers follow it as published.
            fallbacks=list(cat.fallback_chain(name)),
            routing_policy=cat.policy_name_for(name),
            # `min 0, max 0` is parked, not on demand: a request for it must not ask for (and wait on) a load.
            on_demand=m.on_demand and bool(m.spec.profiles),
            simulated=bool(m.spec.profiles) and all(p.profile.engine == "sim" for p in m.profiles),
            provider=None
            if m.spec.provider is None
            else PublishedProvider(
                url=m.spec.provider.url,
                model=m.spec.provider.model,
                key=m.spec.provider.key,
                api=m.spec.provider.api,
                workflow=m.spec.provider.workflow,
            ),
            tokenizer_dir=m.spec.tokenizer_dir,
            disaggregation=_pools(cat, m.spec.disaggregation),
        )
        for name, m in cat.models.items()
    }


def _pools(cat: Catalog, pd: Disaggregation | None) -> Disaggregation | None:
    """A model's pairing with its pools named as routers key them: by name, aliases resolved."""
    if pd is None:
        return None
    prefill, decode = cat.resolve(pd.prefill), cat.resolve(pd.decode)
    assert prefill is not None and decode is not None, "validated: both pools are models"
    return pd.model_copy(update={"prefill": prefill.name, "decode": decode.name})


def published_tenants(cat: Catalog) -> Tenants:
    return cat.tenants()


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def token_ok(c: RouterTokenCheck, request: web.Request) -> bool:
    """A router's credential (the router token, or the admin token): never a node's, since the stream
    carries every replica's engine key."""
    presented = bearer_token(request.headers.get("Authorization"))
    return presented is not None and c.router_token_ok(presented)


def fleet_incomplete(c: SnapshotParts) -> bool:
    """Just started (or just took over as leader): nodes that were up have not all reconnected and the settle
    window is open. What this controller knows of the replicas is then a part of the fleet, and a snapshot
    from it would tell routers to drop endpoints that are serving; routers keep their last one meanwhile."""
    ws = c.fleet.worker_state
    if not ws.expected_nodes or c.clock() >= ws.settle_until:
        return False
    back = {name for name, link in c.hub.nodes.items() if link.connected}
    return not ws.expected_nodes <= back


def router_certificate_refusal(c: RouterStreamParts, request: web.Request) -> str | None:
    """With the cluster CA, a router also proves its role with a client certificate (`router:NAME`); a
    node's certificate (or none) does not open the stream that carries every engine key."""
    if c.router_peer_check is None:
        return None
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    try:
        c.router_peer_check(der)
    except (LlmgwError, ValueError, OSError) as exc:  # PeerRejected, CAError, a malformed certificate
        return f"client certificate refused: {exc}"
    return None


@dataclass(frozen=True, slots=True)
class BuiltSnapshot:
    text: str  # the JSON every router is sent
    digest: str


@dataclass
class SnapshotCache:
    """The routers' snapshot, built once per change for every router socket, not once per socket: a change
    (`Controller.notify`) wakes them all at once. What changes without a notice (a pending shard's grace running
    out) is picked up by the sockets' own 5-second wake, so a build is reused for at most `fresh_s`."""

    fresh_s: float = 0.5
    _built: BuiltSnapshot | None = None
    _at: float | None = None  # the event loop's clock at the last build; None: changed since

    def invalidate(self) -> None:
        self._at = None

    def current(self, c: SnapshotParts) -> BuiltSnapshot | None:
        """The snapshot to send now; None while there is nothing to send (no revision, the fleet incomplete)."""
        now = asyncio.get_running_loop().time()
        if self._at is None or now - self._at >= self.fresh_s:
            snap = None if fleet_incomplete(c) else snapshot(c)
            data = {} if snap is None else snap.model_dump(mode="json")
            self._built = None if snap is None else BuiltSnapshot(json.dumps(data), _digest(data))
            self._at = now
        return self._built


async def router_stream(
    request: web.Request, *, c: RouterStreamParts, snapshots: SnapshotCache
) -> web.StreamResponse:
    if not token_ok(c, request):
        raise web.HTTPUnauthorized(text="missing or wrong Authorization: Bearer token (a router's)\n")
    refusal = router_certificate_refusal(c, request)
    if refusal is not None:
        log.warning("router stream from %s refused: %s", request.remote, refusal)
        raise web.HTTPUnauthorized(text=refusal + "\n")
    ws = web.WebSocketResponse(heartbeat=30.0)
    await ws.prepare(request)
    wake = asyncio.Event()
    c.change_listeners.append(wake.set)
    c.router_sockets.add(ws)
    c.router_peers[ws] = request.remote or ""  # for the http_sd targets (llmgw.controller.api.prom_sd)
    c.metrics.router_connections.inc()
    reader = asyncio.get_running_loop().create_task(_read_router(ws, c, str(id(ws))))
    try:
        sent = ""
        while not ws.closed and not reader.done():
            built = snapshots.current(c)
            if built is not None and built.digest != sent:
                await ws.send_str(built.text)
                sent = built.digest
            wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await wake.wait()
    except (ConnectionError, RuntimeError):
        pass
    finally:
        c.change_listeners.remove(wake.set)
        c.router_sockets.discard(ws)
        c.router_peers.pop(ws, None)
        c.fleet.worker_state.loads.pop(
            str(id(ws)), None
        )  # a router gone reports nothing: its load is unknown
        c.metrics.router_connections.dec()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    return ws


async def _read_router(ws: web.WebSocketResponse, c: RouterStreamParts, key: str) -> None:
    async for msg in ws:
        if msg.type != WSMsgType.TEXT:
            continue
        try:
            data = jsonsafe.loads(msg.data)  # a router's message nested too deeply is dropped, not a crash
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if data.get("type") == "usage":
            note_usage(c, data.get("models", []))
        elif data.get("type") == "demand" and isinstance(data.get("model"), str):
            note_demand(c, data["model"])
        elif data.get("type") == "load":
            note_load(c, key, data)


class _ModelLoad(BaseModel):
    model_config = ConfigDict(extra="ignore")
    queued: int = Field(0, ge=0)
    inflight: int = Field(0, ge=0)
    ttft_p99_ms: float | None = Field(None, ge=0)
    refused: int = Field(0, ge=0)


class _EngineReading(BaseModel):
    model_config = ConfigDict(extra="ignore")
    running: float | None = Field(None, ge=0)
    waiting: float | None = Field(None, ge=0)
    kv_usage: float | None = Field(None, ge=0, le=1)
    scrape_error: str | None = Field(None, max_length=2000)


class _ReplicaLoad(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inflight: int = Field(0, ge=0)
    last_request_at: float | None = None
    routed: bool = True
    requests: int = Field(0, ge=0)
    errors: int = Field(0, ge=0)
    ttft_p99_ms: float | None = Field(None, ge=0)
    engine: _EngineReading | None = None  # absent from an older router: unknown


class _LoadMessage(BaseModel):
    """The router's `load` message (llmgw_router.fleet.load); fields a newer router adds are ignored."""

    model_config = ConfigDict(extra="ignore")
    models: dict[str, _ModelLoad] = Field(default_factory=dict, max_length=100_000)
    replicas: dict[str, _ReplicaLoad] = Field(default_factory=dict, max_length=100_000)


_bad_load_warned: set[str] = set()


def note_load(c: LoadParts, router: str, data: dict[str, Any]) -> bool:
    """Keep router `router`'s load report (replacing its last); a malformed one is dropped, said once."""
    try:
        msg = _LoadMessage.model_validate(data)
    except ValidationError as exc:
        if router not in _bad_load_warned:
            _bad_load_warned.add(router)
            log.warning("a router's load report was dropped (%d problem(s)): %s", exc.error_count(), exc)
        return False
    now = c.wall()
    d = c.desired
    models: dict[str, Demand] = {}
    for name, m in msg.models.items():
        view = d.resolve(name) if d else None
        if view is not None:
            models[view.name] = Demand(m.queued, m.inflight, m.refused, m.ttft_p99_ms, now)
    replicas = {
        rid: ReplicaLoad(
            r.inflight,
            r.last_request_at,
            r.routed,
            r.requests,
            r.errors,
            r.ttft_p99_ms,
            None if r.engine is None else EngineReading(**r.engine.model_dump()),
        )
        for rid, r in msg.replicas.items()
    }
    previous = c.fleet.worker_state.loads.get(router)
    c.fleet.worker_state.loads[router] = RouterLoad(now, models, replicas)
    if _load_moved(previous, models):
        c.notify("load report")
    return True


def _load_moved(previous: RouterLoad | None, models: dict[str, Demand]) -> bool:
    """Wake the reconciler when a model's queue or refusals appear or its load changes by a fifth: a
    steady stream of identical reports must not run a pass a second."""
    if previous is None:
        return True
    for name, now in models.items():
        before = previous.models.get(name)
        if before is None or (now.queued > 0) != (before.queued > 0) or now.refused:
            return True
        if abs(now.load - before.load) > max(1, before.load // 5):
            return True
    return False


def note_usage(c: LoadParts, models: Any) -> int:
    """Models used (a list of names, or a map of name -> count); returns how many were known."""
    d = c.desired
    names = list(models) if isinstance(models, list | dict) else []
    known = 0
    for name in names:
        view = d.resolve(str(name)) if d else None
        if view is not None:
            c.fleet.worker_state.model(view.name).used_at = c.wall()
            known += 1
    return known


def note_demand(c: LoadParts, name: str) -> str | None:
    """A router wants an on-demand model loaded; returns the model's name, or None when unknown."""
    d = c.desired
    view = d.resolve(name) if d else None
    if view is None:
        return None
    record = c.fleet.worker_state.model(view.name)
    first = record.demand_at is None
    record.demand_at = c.wall()
    if first or not any(r.model == view.name for r in c.fleet.replicas.values()):
        c.notify(f"demand for {view.name}")
    return view.name
