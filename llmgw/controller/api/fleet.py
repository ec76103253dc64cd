"""The admin API's fleet operations: restart a model or a replica (rolled make-before-break), drain a node
for maintenance and uncordon it, hold a facility domain (a rack, a PDU...) and release it. Each needs scope `apply` (whoever may change what runs by a revision may
bounce it) and is audited (llmgw.controller.api.audited).

The reconcile loop does the work: these handlers only mark what an operator asked for (a replica's restart
flag, a model's roll pace, a node's drain) and wake it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from llmgw.controller.api.audited import AUDIT_DETAIL, AUDIT_OBJECT
from llmgw.controller.api.guard import PRINCIPAL, error, require_parts
from llmgw.controller.parts.fleet import FleetActor
from llmgw.core import jsonsafe
from llmgw.core.config.models import FACILITY_LEVELS
from llmgw.core.placement.facility import domain_refs
from llmgw.store import FacilityHold, StoreError

__all__ = ["PARTS", "drain", "hold", "holds", "release", "restart", "uncordon"]


# What the handlers read and do: the fleet's records, the store, events and notices (app.py puts the
# Controller here).
PARTS: web.AppKey[FleetActor] = web.AppKey("fleet_parts")


def _count(body: dict[str, Any], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{field} must be a whole number >= 0 (or left out: the model's rollout block)")
    return value


async def restart(request: web.Request) -> web.Response:
    """`{"target": MODEL|REPLICA, "max_surge": N, "max_unavailable": M}`: every replica of the model (or the
    one replica) is replaced, make-before-break, at that pace (default: the model's `rollout`)."""
    c = require_parts(request, "apply", PARTS)
    try:
        body = jsonsafe.loads(await request.read() or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("target"), str) or not body["target"]:
        return error(400, 'body must be {"target": MODEL or REPLICA, "max_surge": N, "max_unavailable": M}')
    target = body["target"]
    request[AUDIT_OBJECT] = target
    try:
        surge, unavailable = _count(body, "max_surge"), _count(body, "max_unavailable")
    except ValueError as exc:
        return error(400, str(exc))
    d = c.desired
    if d is None:
        return error(409, "no revision is applied yet: there is nothing to restart")
    rec = c.fleet.replicas.get(target)
    if rec is not None:
        model, picked = rec.model, [rec]
    else:
        entry = d.resolve(target)
        if entry is None:
            return error(404, f"{target!r} is neither a model of the applied revision nor a replica id")
        model = entry.name
        picked = [r for r in c.fleet.replicas.values() if r.model == model and not r.stopping]
    if model not in d.models:
        return error(
            409, f"model {model} is no longer in the applied revision: its replicas are being stopped"
        )
    rollout = d.models[model].spec.rollout
    pace = (
        rollout.max_surge if surge is None else surge,
        rollout.max_unavailable if unavailable is None else unavailable,
    )
    if pace == (0, 0):
        return error(400, "max_surge 0 and max_unavailable 0 cannot make progress: give one of them >= 1")
    for r in picked:
        r.restart = True
    c.fleet.worker_state.model(model).pace = pace
    request[AUDIT_DETAIL] = f"max_surge {pace[0]}, max_unavailable {pace[1]}"
    ids = sorted(r.id for r in picked)
    await c.event(
        "restart_asked",
        target,
        f"{len(ids)} replica(s) of {model} by {request[PRINCIPAL].name}, max_surge {pace[0]}, "
        f"max_unavailable {pace[1]}",
    )
    c.notify("restart asked")
    return web.json_response(
        {"model": model, "replicas": ids, "max_surge": pace[0], "max_unavailable": pace[1]}, status=202
    )


def _node(request: web.Request, c: FleetActor) -> str | web.Response:
    node = request.match_info["node"]
    request[AUDIT_OBJECT] = node
    if node not in c.agents.nodes:
        known = ", ".join(sorted(c.agents.nodes)) or "none"
        return error(404, f"node {node!r} has never connected to this controller (nodes: {known})")
    return node


async def drain(request: web.Request) -> web.Response:
    """Cordon the node (nothing new is placed there) and move its replicas elsewhere, make-before-break:
    each stops once its replacement is ready; one nothing can replace keeps serving and is reported."""
    c = require_parts(request, "apply", PARTS)
    node = _node(request, c)
    if isinstance(node, web.Response):
        return node
    when = datetime.fromtimestamp(c.wall(), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    words = f"by {request[PRINCIPAL].name} at {when}"
    try:  # recorded first: a drain a restarted controller would forget is not one to rely on
        await c.store.set_node_drain(node, words, c.wall())
    except StoreError as exc:
        return error(503, f"the store did not take the drain, nothing changed: {exc}")
    c.fleet.worker_state.drained[node] = words
    moving = sorted(r.id for r in c.fleet.replicas.values() if node in r.nodes and not r.stopping)
    await c.event(
        "node_drain", node, f"drained by {request[PRINCIPAL].name}: moving {len(moving)} replica(s)"
    )
    c.notify("node drained")
    return web.json_response({"node": node, "drained": True, "moving": moving}, status=202)


async def uncordon(request: web.Request) -> web.Response:
    """Undo a drain: the node takes new replicas again (those moved away stay where they went)."""
    c = require_parts(request, "apply", PARTS)
    node = _node(request, c)
    if isinstance(node, web.Response):
        return node
    try:
        await c.store.clear_node_drain(node)
    except StoreError as exc:
        return error(503, f"the store did not take the uncordon, nothing changed: {exc}")
    was = c.fleet.worker_state.drained.pop(node, None)
    d = c.desired
    declared = d.catalog.nodes.get(node) if d is not None else None
    in_repo = bool(declared and declared.spec.cordoned)
    note = "; still cordoned by the repo (spec.cordoned: true)" if in_repo else ""
    await c.event("node_uncordon", node, f"uncordoned by {request[PRINCIPAL].name}" + note)
    c.notify("node uncordoned")
    return web.json_response({"node": node, "was_drained": was is not None, "cordoned_in_repo": in_repo})


def _domain(request: web.Request) -> str | web.Response:
    ref = request.match_info["domain"]
    request[AUDIT_OBJECT] = ref
    level, _, value = ref.partition("=")
    if level not in FACILITY_LEVELS or not value:
        levels = ", ".join(FACILITY_LEVELS)
        return error(
            400, f"{ref!r} is not a facility domain: write LEVEL=VALUE, LEVEL one of {levels} (rack=r12)"
        )
    return ref


def _nodes_in(c: FleetActor, ref: str) -> list[str]:
    return sorted(name for name, link in c.agents.nodes.items() if ref in domain_refs(_labels(c, name, link)))


def _labels(c: FleetActor, name: str, link: Any) -> dict[str, str]:
    labels = dict(link.inventory.labels)
    d = c.desired
    declared = d.catalog.nodes.get(name) if d is not None else None
    if declared is not None:
        labels.update(declared.labels)
    return labels


async def hold(request: web.Request) -> web.Response:
    """`{"drain": bool}`: nothing new is placed on the domain's nodes until it is released; with drain, their
    replicas move elsewhere too (make-before-break, as a node drain)."""
    c = require_parts(request, "apply", PARTS)
    ref = _domain(request)
    if isinstance(ref, web.Response):
        return ref
    try:
        body = jsonsafe.loads(await request.read() or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("drain", False), bool):
        return error(400, 'body must be {"drain": true|false} (or empty)')
    drain_too = bool(body.get("drain", False))
    when = datetime.fromtimestamp(c.wall(), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    held = FacilityHold(f"by {request[PRINCIPAL].name} at {when}; llmgw facility release {ref}", drain_too)
    try:  # recorded first, as a drain: a hold a restarted controller would forget is not one to rely on
        await c.store.set_facility_hold(ref, held, c.wall())
    except StoreError as exc:
        return error(503, f"the store did not take the hold, nothing changed: {exc}")
    c.fleet.worker_state.holds[ref] = held
    nodes = _nodes_in(c, ref)
    moving = (
        sorted(r.id for r in c.fleet.replicas.values() if set(r.nodes) & set(nodes) and not r.stopping)
        if drain_too
        else []
    )
    request[AUDIT_DETAIL] = "drain" if drain_too else "hold"
    words = f"held by {request[PRINCIPAL].name}: {len(nodes)} node(s)"
    await c.event("facility_hold", ref, words + (f", moving {len(moving)} replica(s)" if drain_too else ""))
    c.notify("facility held")
    return web.json_response(
        {"domain": ref, "drain": drain_too, "nodes": nodes, "moving": moving}, status=202
    )


async def release(request: web.Request) -> web.Response:
    """Undo a hold: the domain's nodes take new replicas again (what moved away stays where it went)."""
    c = require_parts(request, "apply", PARTS)
    ref = _domain(request)
    if isinstance(ref, web.Response):
        return ref
    try:
        await c.store.clear_facility_hold(ref)
    except StoreError as exc:
        return error(503, f"the store did not take the release, nothing changed: {exc}")
    was = c.fleet.worker_state.holds.pop(ref, None)
    await c.event("facility_release", ref, f"released by {request[PRINCIPAL].name}")
    c.notify("facility released")
    return web.json_response({"domain": ref, "was_held": was is not None, "nodes": _nodes_in(c, ref)})


async def holds(request: web.Request) -> web.Response:
    """Every held domain, with its words, whether it drains and the nodes standing in it now."""
    c = require_parts(request, "plan", PARTS)
    return web.json_response(
        {
            "holds": [
                {"domain": ref, "words": h.words, "drain": h.drain, "nodes": _nodes_in(c, ref)}
                for ref, h in sorted(c.fleet.worker_state.holds.items())
            ]
        }
    )
