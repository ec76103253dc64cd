"""Read-only views of the controller: what the decisions read, and what the admin API shows.

Functions of the controller's parts taken at one moment (a FleetReader: llmgw.controller.parts.fleet); they
never change them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmgw_agent.protocol import Inventory, ShardStatus

from llmgw.controller.parts.canary_record import unread_json
from llmgw.controller.parts.fleet import FleetReader, StatusReader
from llmgw.controller.parts.state import ModelRecord
from llmgw.controller.status import node_builds
from llmgw.controller.status.capacity import capacity_json, decision_json
from llmgw.core import placement as node_facts
from llmgw.core.fleet.states import ACTIVE_STATES, ReplicaState, ShardState as FleetShardState, is_stale
from llmgw.core.fleet.views import (
    GpuView,
    IfUndeclared,
    LivePeer,
    LiveState,
    ModelState,
    NodeView,
    ReplicaView,
    ShardView,
    held_weights_keys,
    undeclared_words,
)
from llmgw.core.placement.facility import domain_refs, hold_words, node_power_caps
from llmgw.core.plan import catalog_documents

if TYPE_CHECKING:
    from llmgw.controller.parts.state import ReplicaRec

PENDING_GRACE_S = 60.0  # a started shard the agent never reported is failed after this


def shard_status(c: FleetReader, rec: ReplicaRec, rank: int = 0) -> ShardStatus | None:
    shard = next((s for s in rec.shards if s.rank == rank), None)
    link = c.agents.nodes.get(shard.node) if shard else None
    return None if link is None else link.shards.get(f"{rec.id}-{rank}")


def replica_view(c: FleetReader, rec: ReplicaRec) -> ReplicaView:
    shards: list[ShardView] = []
    reported = False
    for placed in rec.shards:
        status = shard_status(c, rec, placed.rank)
        state: FleetShardState = "starting"
        if status is not None:
            reported = True
            state = "failed" if status.state == "stopped" and not rec.stopping else status.state
        shards.append(ShardView(placed.node, placed.rank, placed.gpus, state))
    overall: ReplicaState = "starting"
    if rec.draining:
        overall = "draining"
    elif rec.stopping:
        overall = "stopping"
    elif rec.error:
        overall = "failed"
    elif not reported:
        waited = c.clock() - rec.start_sent_at
        overall = "failed" if waited > PENDING_GRACE_S + c.settings.command_timeout_s else "pending"
    return ReplicaView(
        id=rec.id,
        model=rec.model,
        profile=rec.profile,
        fingerprint=rec.fingerprint,
        shards=tuple(shards),
        state=overall,
        created_at=rec.created_at,
        adopted=rec.adopted,
        stale=rec.stale,
        ready_since=rec.ready_since,
        restart=rec.restart,
        replaces=rec.replaces if rec.replaces in c.fleet.replicas else None,
    )


def replica_state(c: FleetReader, rec: ReplicaRec) -> str:
    """The replica's state in words: the fleet's states, plus `lost` and `unknown` (node Unreachable)."""
    states = {c.agents.nodes[n].state if n in c.agents.nodes else "Lost" for n in rec.nodes}
    if "Lost" in states:
        return "lost"
    view = replica_view(c, rec)
    state = view.effective_state()
    if "Unreachable" in states and state != "stopping":
        return "unknown"
    return state


def node_views(c: FleetReader) -> list[NodeView]:
    d = c.desired
    out: list[NodeView] = []
    for link in c.agents.nodes.values():
        inv = link.inventory
        declared = d.catalog.nodes.get(link.name) if d else None
        labels = node_builds.node_labels(c, link.name, inv)
        holds = c.fleet.worker_state.holds
        held = hold_words(labels, {ref: h.words for ref, h in holds.items()})
        draining = any(holds[ref].drain for ref in domain_refs(labels) if ref in holds)
        disk_free, shared_disk = node_facts.cache_disk(
            None
            if inv.disks is None
            else [
                node_facts.CacheDisk(
                    x.free_bytes, x.shared, x.holds_cache, x.fstype, x.mount_source, x.filesystem_id
                )
                for x in inv.disks
            ]
        )
        out.append(
            NodeView(
                name=link.name,
                state=link.state,
                labels=labels,
                cordoned=bool(declared and declared.spec.cordoned)
                or _removing(c, link.name)
                or link.name in c.fleet.worker_state.drained,
                cordon_reason=_cordon_words(c, link.name),
                leaving=_removing(c, link.name),
                drained=link.name in c.fleet.worker_state.drained or draining,
                held=held,
                power_watts=declared.spec.power_watts if declared else None,
                power_caps=node_power_caps(labels, d.cluster.facilities.power_caps) if d else {},
                fabric=declared.spec.fabric if declared else None,
                cpu_cores=inv.cpu_cores,
                memory_bytes=inv.memory_bytes,
                disk_free_bytes=disk_free,
                shared_disk=shared_disk,
                gpus=_gpus(c, inv),
                engines=None if inv.engines is None else {k: v.version for k, v in inv.engines.items()},
                engine_refusals=_engine_refusals(c, link.name, inv),
                engine_warnings={
                    e: ch.warning
                    for e, ch in node_builds.build_choices(c, link.name, inv).items()
                    if ch.warning
                },
                power_draw_watts=link.thermals.power_draw_watts() if link.thermals is not None else None,
                weights=None
                if inv.weights is None
                else frozenset(
                    key
                    for w in inv.weights
                    for key in held_weights_keys(w.url, w.path, w.sha256, w.directory, w.manifest_sha256)
                ),
            )
        )
    return sorted(out, key=lambda n: n.name)


def _gpus(c: FleetReader, inv: Inventory) -> tuple[GpuView, ...] | None:
    """The node's cards as placement reads them, each with its class's declared watts (power caps)."""
    if inv.gpus is None:
        return None
    classes = c.desired.cluster.gpu_classes if c.desired else {}
    return tuple(
        GpuView(
            g.index,
            g.gpu_class,
            g.memory_bytes,
            fault=g.fault,
            unusable=g.unusable,
            watts=classes[g.gpu_class].watts if g.gpu_class in classes else None,
        )
        for g in inv.gpus
    )


def _engine_refusals(c: FleetReader, name: str, inv: Inventory) -> dict[str, str]:
    d = c.desired
    conditions = [
        node_facts.ConditionFact(x.type, x.engine, x.message, tuple(x.tail)) for x in inv.conditions
    ]
    engines = {str(engine): settings for engine, settings in (d.cluster.engines.items() if d else ())}
    built = {e: ch.refusal for e, ch in node_builds.build_choices(c, name, inv).items() if ch.refusal}
    return node_facts.engine_refusals(engines, node_builds.platform_facts(inv), conditions, built)


def _cordon_words(c: FleetReader, node: str) -> str:
    if _removing(c, node):
        return "removed from the repo"
    drained = c.fleet.worker_state.drained.get(node)
    return f"drained ({drained}; llmgw node uncordon {node})" if drained is not None else ""


def _removing(c: FleetReader, node: str) -> bool:
    op = c.fleet.nodes.ops(node)
    return op is not None and op.removal is not None


def if_undeclared(c: FleetReader, node: str) -> IfUndeclared:
    """What this controller does with `node` while the repo does not declare it. It removes only remote nodes
    its applied revision declares (or that it is removing now): those it saw the repo ask for and can reach
    over SSH (nodes_loop). Any other agent with the token — a node removed from the repo while no controller
    ran, a `local: true` node, one that never was declared — is left as it is, on purpose: a repo that does
    not know a machine cannot say to stop what runs there."""
    if _removing(c, node):
        return "remove"
    d = c.desired
    entry = d.catalog.nodes.get(node) if d else None
    remote = entry is not None and not entry.spec.local
    return "remove" if remote and c.settings.bootstrap_nodes else "keep"


def replicas_by_node(c: FleetReader) -> dict[str, list[str]]:
    """Each node's replica ids, sorted; built once per view (asking every replica for each of 1,000 nodes
    made the status and the node list take seconds)."""
    out: dict[str, list[str]] = {}
    for rec in c.fleet.replicas.values():
        for node in set(rec.nodes):
            out.setdefault(node, []).append(rec.id)
    for ids in out.values():
        ids.sort()
    return out


def undeclared_json(c: FleetReader) -> list[dict[str, Any]]:
    """Connected nodes the applied revision does not declare, and what happens to them (for status)."""
    d = c.desired
    out: list[dict[str, Any]] = []
    held = replicas_by_node(c)
    for name in sorted(c.agents.nodes):
        if d is not None and name in d.catalog.nodes:
            continue
        count = len(held.get(name, ()))
        action = if_undeclared(c, name)
        out.append(
            {"node": name, "replicas": count, "action": action, "message": undeclared_words(action, count)}
        )
    return out


def replica_views(c: FleetReader) -> list[ReplicaView]:
    return [replica_view(c, r) for r in sorted(c.fleet.replicas.values(), key=lambda r: r.id)]


def stale(c: FleetReader, rec: ReplicaRec) -> bool:
    """A replica whose profile changed since it was placed, or is gone: the fleet's one rule (fleet/states)."""
    d = c.desired
    if d is None or rec.model not in d.models:
        return False
    return is_stale(rec.fingerprint, d.fingerprint(rec.model, rec.profile))


def fetches(c: FleetReader, rec: ReplicaRec) -> list[dict[str, Any]]:
    """Each shard still fetching weights: bytes done and the total (None when the server sent no length:
    no percentage is made up). A shard past `fetching` drops out, so a finished fetch is never shown."""
    out = []
    for placed in rec.shards:
        status = shard_status(c, rec, placed.rank)
        if status is not None and status.state == "fetching":
            out.append(
                {
                    "replica": rec.id,
                    "node": placed.node,
                    "bytes_done": status.fetch_bytes_done or 0,
                    "bytes_total": status.fetch_bytes_total,
                }
            )
    return out


GIB = 1024**3


def _sum_known(values: list[int | None]) -> int | None:
    """A sum only when every part is known: a partial sum would read as the whole."""
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def replica_memory(c: FleetReader, rec: ReplicaRec) -> dict[str, int | None]:
    """What the replica's engines hold against what its profile reserved; None where unknown (no report, no
    nvidia-smi, no min_memory_gb, no GPU). Resident memory is the sum over every shard's process group."""
    statuses = [shard_status(c, rec, placed.rank) for placed in rec.shards]
    entry = c.desired.models.get(rec.model) if c.desired is not None else None
    found = entry.profile(rec.profile) if entry is not None else None
    gb = found.profile.min_memory_gb if found is not None else None
    card: list[int | None] = []
    for placed in rec.shards:
        link = c.agents.nodes.get(placed.node)
        gpus = {g.index: g.memory_bytes for g in (link.inventory.gpus or [])} if link is not None else {}
        card += [gpus.get(i) for i in placed.gpus]
    return {
        "rss_bytes": _sum_known([s.rss_bytes if s else None for s in statuses]),
        "reserved_bytes": None if gb is None else int(gb * GIB) * len(rec.shards),
        "gpu_bytes": _sum_known([s.gpu_memory_bytes if s else None for s in statuses]) if card else None,
        "gpu_reserved_bytes": _sum_known(card) if card else None,
    }


OUTPUT_TAIL_LINES = 20  # of an engine's output, in /api/v1/replicas for an admin-scope token


def _output_tail(shard: ShardStatus | None, state: str) -> list[str]:
    return shard.last_output_lines[-OUTPUT_TAIL_LINES:] if shard and state in ("starting", "failed") else []


def replica_json(c: FleetReader, rec: ReplicaRec, *, with_output: bool = False) -> dict[str, Any]:
    """The replica as the admin API shows it. An engine's output can carry what clients sent (prompts), so its
    tail is there only `with_output` (an admin-scope caller, as for `/logs`); otherwise `last_output_lines` is
    null: not shown, which is not the same as no output."""
    shard = shard_status(c, rec)
    state = replica_state(c, rec)
    failed = state == "failed"
    return {
        "id": rec.id,
        "model": rec.model,
        "profile": rec.profile,
        "node": rec.node,
        "nodes": list(rec.nodes),
        "state": state,
        "adopted": rec.adopted,
        "stale_profile": stale(c, rec),
        "fingerprint": rec.fingerprint,
        "pid": shard.pid if shard else None,
        "base_url": shard.base_url if shard else None,
        "gpus": list(rec.gpus),
        "error": rec.error or (shard.message if shard and failed else ""),
        # While it starts (a slow load shows what it is doing) and once it failed; `llmgw logs` for the rest.
        "last_output_lines": _output_tail(shard, state) if with_output else None,
        "fetching": fetches(c, rec),
        "memory": replica_memory(c, rec),
        "age_s": round(c.wall() - rec.created_at, 1),
    }


def failing(state: ModelState | None) -> bool:
    """The model has failed replicas not yet forgotten (see BackoffPolicy.reset_after)."""
    return state is not None and state.failures > 0


def health_word(*, unassessed: bool, settled: bool, failing_now: bool, live: int) -> str:
    """A model's health in Argo CD's words, from what its status found, in this order of precedence."""
    if unassessed:
        return "Unknown"  # Argo CD's word for a health not yet assessed (Progressing would be a guess)
    if settled:
        return "Healthy"
    if failing_now:
        # A model whose replicas keep failing stays Degraded while its next attempt starts: "Progressing"
        # between two crashes would hide a crash loop from anyone looking at the status between them.
        return "Degraded"
    return "Progressing" if live > 0 else "Missing"


def model_health(c: FleetReader, name: str) -> dict[str, Any]:
    """Argo CD's words: Healthy, Progressing, Degraded, Missing, and Unknown (not yet assessed)."""
    d = c.desired
    assert d is not None
    model = d.models[name]
    states = [replica_state(c, r) for r in c.fleet.replicas.values() if r.model == name]
    ready = states.count("ready")
    live = sum(1 for s in states if s in ACTIVE_STATES)
    record = c.fleet.worker_state.models.get(name) or ModelRecord()
    target = record.target if record.target is not None else model.spec.scaling.min
    mine = [r for r in c.fleet.replicas.values() if r.model == name and not r.stopping]
    restarting = sum(1 for r in mine if r.restart)
    auto = model.spec.restarts_on_change
    # Read from the replicas, not only from the last pass: `apply --wait` right after an apply must not see
    # Healthy before the pass that starts the roll has run.
    canary = c.fleet.canaries.json(name)
    # A new leader's first moment: the last leader's canary runs are not read yet, so whether this model's
    # stale replicas are held on a failed canary or about to roll through one is not known.
    canary_unread = (
        canary is None
        and model.spec.rollout.strategy == "canary"
        and not c.fleet.worker_state.earlier_state_read
    )
    if canary_unread:
        canary = unread_json()
    # A canary model rolls on a change through its canary (none begun yet is one about to begin) unless the
    # canary of this revision failed: then its stale replicas are the stable ones it is held on.
    auto = auto or (model.spec.rollout.strategy == "canary" and not c.fleet.canaries.held(name, d))
    any_stale = any(stale(c, r) for r in mine)
    rolling = record.rolling or restarting > 0 or (auto and any_stale)
    health = health_word(
        unassessed=canary_unread and any_stale,
        settled=(not model.spec.profiles or ready >= target) and not rolling,
        failing_now=record.unplaceable is not None or failing(record.backoff) or "failed" in states,
        live=live,
    )
    return {
        "model": name,
        "health": health,
        "ready": ready,
        "replicas": len(states),
        "target": target,
        "min": model.spec.scaling.min,
        "max": model.spec.scaling.max,
        "unplaceable": dict(record.unplaceable or {}),
        "failures": record.backoff.failures if record.backoff is not None else 0,
        "waiting": record.wait,
        "stale_replicas": sum(1 for r in c.fleet.replicas.values() if r.model == name and stale(c, r)),
        "restarting": restarting,
        "rolling": rolling,
        "canary": canary,
        "fetching": [f for r in c.fleet.replicas.values() if r.model == name for f in fetches(c, r)],
        "autoscale": decision_json(record.scaled, _demand_json(c, name)),
        "memory": model_memory(c, name),
    }


def model_memory(c: FleetReader, name: str) -> dict[str, int | None]:
    """The model's ready replicas' memory, summed (None when any of them is unknown, or none is ready)."""
    each = [
        replica_memory(c, r)
        for r in c.fleet.replicas.values()
        if r.model == name and replica_state(c, r) == "ready"
    ]
    return {
        key: _sum_known([m[key] for m in each])
        for key in ("rss_bytes", "reserved_bytes", "gpu_bytes", "gpu_reserved_bytes")
    }


def _demand_json(c: FleetReader, name: str) -> dict[str, Any] | None:
    demand = c.fleet.worker_state.model_demand().get(name)
    if demand is None:
        return None
    return {
        "queued": demand.queued,
        "inflight": demand.inflight,
        "refused": demand.refused,
        "ttft_p99_ms": demand.ttft_p99_ms,
        "reported_at": demand.at,
    }


def status_json(c: StatusReader) -> dict[str, Any]:
    d = c.desired
    return {
        "applied": None
        if d is None
        else {
            "revision": d.revision,
            "source": d.source,
            "applied_at": c.applied_at,
            "cluster": d.cluster_name,
        },
        "seen": None
        if c.seen is None
        else {"revision": c.seen.revision, "source": c.seen.where, "at": c.seen.at},
        "polled": None
        if c.polled is None
        else {"revision": c.polled.revision, "source": c.polled.where, "at": c.polled.at},
        "sync": c.sync_status(),
        "leadership": c.leadership(),
        "source_error": c.source_error,
        "refused": None
        if c.refused is None
        else {
            "revision": c.refused.revision,
            "source": c.refused.where,
            "at": c.refused.at,
            "errors": list(c.refused.errors),
        },
        "models": [model_health(c, n) for n in sorted(d.models)] if d else [],
        "nodes": {
            s: sum(1 for n in c.agents.nodes.values() if n.state == s)
            for s in ("Ready", "Unreachable", "Lost")
        },
        "undeclared_nodes": undeclared_json(c),
        "node_conditions": [
            {"node": name} | cond.model_dump(mode="json")
            for name, link in sorted(c.agents.nodes.items())
            for cond in link.inventory.conditions
        ],
        "replicas": len(c.fleet.replicas),
        "capacity": capacity_json(c, replica_state),
        "reconcile": {
            "passes": c.fleet.worker_state.passes,
            "last_pass_at": c.fleet.worker_state.last_pass_at,
            "last_actions": list(c.fleet.worker_state.last_actions),
        },
    }


def nodes_json(c: FleetReader) -> list[dict[str, Any]]:
    d = c.desired
    out: list[dict[str, Any]] = []
    held = replicas_by_node(c)
    for view in node_views(c):
        link = c.agents.nodes[view.name]
        out.append(
            {
                "name": view.name,
                "state": view.state,
                "connected": link.connected,
                "declared": bool(d and view.name in d.catalog.nodes),
                "if_undeclared": if_undeclared(c, view.name),
                "address": link.address,
                "agent_version": link.agent_version,
                "clock_offset_s": None if (o := link.clock_offset) is None else round(o, 3),
                "metrics_address": link.metrics_address,
                "last_seen_s": round(c.clock() - link.last_seen, 1),
                "labels": dict(view.labels),
                "inventory": link.inventory.model_dump(mode="json", by_alias=True),
                "thermals": None if link.thermals is None else link.thermals.model_dump(mode="json"),
                "power_draw_watts": view.power_draw_watts,
                "shards": len(link.shards),
                "replicas": held.get(view.name, []),
                "cordoned": view.cordoned,
                "cordon_reason": view.cordon_reason or ("cordoned in the repo" if view.cordoned else ""),
                "drained": view.drained,
                "held": view.held,
                **_node_ops_json(c, view.name),
            }
        )
    out.extend(_unlinked_nodes_json(c))
    return out


def _node_ops_json(c: FleetReader, node: str) -> dict[str, Any]:
    """The node's SSH bootstrap and removal, as llmgw.controller.loops.nodes keeps them (None: not done here)."""
    op = c.fleet.nodes.ops(node)
    return {
        "bootstrap": None if op is None else op.bootstrap_json(c.clock()),
        "removal": None if op is None else op.removal_json(),
    }


def _unlinked_nodes_json(c: FleetReader) -> list[dict[str, Any]]:
    """Remote nodes declared (or being removed) whose agent has not connected: `NotJoined` / `Removed`."""
    d = c.desired
    declared = {n: e for n, e in (d.catalog.nodes.items() if d else ()) if not e.spec.local}
    out: list[dict[str, Any]] = []
    for name in sorted((set(declared) | set(c.fleet.nodes.all_ops())) - set(c.agents.nodes)):
        entry = declared.get(name)
        out.append(
            {
                "name": name,
                "state": "NotJoined" if entry is not None else "Removed",
                "connected": False,
                "declared": entry is not None,
                "if_undeclared": if_undeclared(c, name),
                "address": entry.spec.address if entry is not None else None,
                "agent_version": None,
                "clock_offset_s": None,
                "metrics_address": None,
                "last_seen_s": None,
                "labels": dict(entry.labels) if entry is not None else {},
                "inventory": None,
                "shards": 0,
                "replicas": sorted(r.id for r in c.fleet.replicas.values() if name in r.nodes),
                **_node_ops_json(c, name),
            }
        )
    return out


def live_state(c: FleetReader) -> LiveState:
    """What `llmgw plan` compares the repo against. Secrets (engine keys) are never part of it."""
    d = c.desired
    state = LiveState.from_views(
        node_views(c),
        replica_views(c),
        revision=d.revision if d else None,
        taken_at=c.wall(),
        models={name: m.spec for name, m in d.models.items()} if d else None,
        # Nothing applied yet: no document, so every one the repo declares is planned as added.
        documents=catalog_documents(d.catalog) if d else {},
    )
    nodes = [n.model_copy(update={"if_undeclared": if_undeclared(c, n.name)}) for n in state.nodes]
    peers = {name: LivePeer(up=v.up, models=sorted(v.models)) for name, v in c.fleet.peers.items()}
    return state.model_copy(update={"nodes": nodes, "peers": peers})


def engine_version_of(c: FleetReader, replica_id: str) -> str:
    """The repo's version for the replica's engine (profile, then Cluster), else its node's inventory's."""
    rec = c.fleet.replicas.get(replica_id)
    d = c.desired
    if rec is None or d is None:
        return "unknown"
    entry = d.models.get(rec.model)
    profile = entry.profile(rec.profile) if entry else None
    engine = profile.profile.engine if profile else None
    if profile is not None and profile.profile.engine_version:
        return profile.profile.engine_version
    declared = d.cluster.engines.get(engine) if engine else None
    if declared is not None and declared.version:
        return declared.version
    link = c.agents.nodes.get(rec.node)
    engines = link.inventory.engines if link is not None else None
    found = engines.get(engine) if engines and engine else None
    return found.version if found is not None and found.version else "unknown"
