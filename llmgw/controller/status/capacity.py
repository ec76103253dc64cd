"""Fleet capacity at a glance, for `llmgw status` and `/api/v1/status` `capacity`: derived from the same records
the node and replica tables show, so it cannot disagree with them.

- per GPU class: total, used by replicas (by the models' class), free, and held by something else (a GPU in
  use outside llmgw is neither used by a model nor free: counting it free is how a fleet looks roomier than
  it is); GPUs of nodes that are not Ready are not counted;
- CPU cores the same way (a node that reports no core count is `unknown`, never 0);
- free whole nodes per fabric: Ready, not cordoned, nothing placed there (what a multi-node replica needs);
- models that cannot be placed, with why (placement's words per node);
- ready replicas by idleness: requests in flight and seconds since the last request any router saw (None, "-"
  in the table, when no router has said: unknown is not idle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from llmgw.core.fleet.autoscale import ScaleDecision
from llmgw.core.fleet.views import ModelView, NodeView, ReplicaView
from llmgw.core.placement import explain

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import FleetReader
    from llmgw.controller.parts.state import ReplicaRec

StateOf = Callable[["FleetReader", "ReplicaRec"], str]

__all__ = ["capacity_json", "decision_json", "unplaced_reasons"]


def _gpu_classes(c: FleetReader) -> dict[str, dict[str, Any]]:
    d = c.desired
    out: dict[str, dict[str, Any]] = {}
    held: dict[tuple[str, int], str] = {}  # (node, gpu index) -> the model class of the replica on it
    for rec in c.fleet.replicas.values():
        entry = d.models.get(rec.model) if d else None
        klass = (entry.spec.model_class if entry else None) or "-"
        for shard in rec.shards:
            for g in shard.gpus:
                held[(shard.node, g)] = klass
    for link in c.agents.nodes.values():
        if link.state != "Ready":
            continue
        for gpu in link.inventory.gpus or []:
            row = out.setdefault(
                gpu.gpu_class or "unknown", {"total": 0, "used": 0, "free": 0, "by_class": {}}
            )
            row["total"] += 1
            holder = held.get((link.name, gpu.index))
            if holder is not None:
                row["used"] += 1
                row["by_class"][holder] = row["by_class"].get(holder, 0) + 1
            else:
                row["free"] += 1
    return dict(sorted(out.items()))


def _cpu(c: FleetReader) -> dict[str, Any]:
    d = c.desired
    total, used, unknown = 0, 0, 0
    by_class: dict[str, int] = {}
    for link in c.agents.nodes.values():
        if link.state != "Ready":
            continue
        if link.inventory.cpu_cores is None:
            unknown += 1
            continue
        total += link.inventory.cpu_cores
    for rec in c.fleet.replicas.values():
        entry = d.models.get(rec.model) if d else None
        found = entry.profile(rec.profile) if entry else None
        cores = found.profile.cpu_cores if found is not None else None
        if cores is None or found is None or found.profile.gpu_class is not None:
            continue
        n = cores * len(rec.shards)
        used += n
        klass = (entry.spec.model_class if entry else None) or "-"
        by_class[klass] = by_class.get(klass, 0) + n
    return {
        "total": total,
        "used": used,
        "free": max(0, total - used),
        "by_class": by_class,
        "nodes_unknown": unknown,
    }


def _free_nodes(c: FleetReader) -> dict[str, list[str]]:
    d = c.desired
    busy = {n for r in c.fleet.replicas.values() for n in r.nodes}
    out: dict[str, list[str]] = {}
    for name, link in sorted(c.agents.nodes.items()):
        declared = d.catalog.nodes.get(name) if d else None
        if link.state != "Ready" or name in busy or (declared is not None and declared.spec.cordoned):
            continue
        fabric = (declared.spec.fabric if declared is not None else None) or "-"
        out.setdefault(fabric, []).append(name)
    return out


def _idle(c: FleetReader, state_of: StateOf) -> list[dict[str, Any]]:
    now = c.wall()
    seen = c.fleet.worker_state.replica_idleness()
    out: list[dict[str, Any]] = []
    for rec in sorted(c.fleet.replicas.values(), key=lambda r: r.id):
        if state_of(c, rec) != "ready":
            continue
        inflight, last = seen.get(rec.id, (None, None))
        out.append(
            {
                "replica": rec.id,
                "model": rec.model,
                "inflight": inflight,
                "idle_s": None if last is None else round(max(0.0, now - last), 1),
            }
        )
    # The idlest first; unknown last (not the idlest: nobody said).
    out.sort(key=lambda r: (r["idle_s"] is None, r["inflight"] or 0, -(r["idle_s"] or 0.0)))
    return out


def capacity_json(c: FleetReader, state_of: StateOf) -> dict[str, Any]:
    """`state_of`: a replica's state in words (views.replica_state)."""
    ws = c.fleet.worker_state
    unplaceable = {
        name: {"reasons": dict(rec.unplaceable), "waiting": rec.wait}
        for name, rec in sorted(ws.models.items())
        if rec.unplaceable is not None
    }
    return {
        "gpus": _gpu_classes(c),
        "cpu_cores": _cpu(c),
        "free_nodes": _free_nodes(c),
        "unplaceable": unplaceable,
        "replicas_by_idleness": _idle(c, state_of),
    }


def decision_json(
    decision: ScaleDecision | None, demand: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The last decision and its inputs, for status and the admin API."""
    if decision is None:
        return None
    return {
        "desired": decision.desired,
        "reason": decision.reason,
        "last_scale_up_at": decision.state.last_up_at,
        "low_since": decision.state.low_since,
        "next_decision_at": decision.wake_at,
        **({"demand": dict(demand)} if demand is not None else {}),
    }


def unplaced_reasons(
    unplaced: Mapping[str, int],
    models: Mapping[str, ModelView],
    nodes: list[NodeView],
    replicas: list[ReplicaView],
) -> dict[str, dict[str, str]]:
    """Why each model a pass could not place is not placed: per node, its first profile's rejection in
    placement's words; under "*" what stops it everywhere (no node connected, a problem of the model's own)."""
    out: dict[str, dict[str, str]] = {}
    for model in unplaced:
        found = explain(model, models, nodes, replicas)
        reasons: dict[str, str] = {}
        for profile, by_node in found.rejections().items():
            for node, why in by_node.items():
                reasons.setdefault(node, f"{profile}: {why}")
        if not nodes:
            reasons["*"] = "no node is connected"
        if found.problem:
            reasons["*"] = found.problem
        out[model] = reasons
    return out
