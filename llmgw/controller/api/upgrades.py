"""`POST /api/v1/upgrade`: roll a new agent version across the nodes bootstrapped over SSH.

Nodes go a batch at a time (`parallel`, 1 by default), in name order; each is upgraded by
`llmgw.adapters.ssh.upgrade` and counts as done only once its agent is back Ready on the new version with every
engine it ran before adopted under the same pid. The first failure ends the run: that node is left on (or
switched back to) the version it ran, and the nodes after it are not touched. A node that is not a remote Node
of the applied revision (`local: true`, or an agent started by hand) is never bootstrapped by the controller,
so it is not upgraded either, and the answer says so for each one.

The request waits for the whole run (minutes on a large fleet): the answer is the per-node account. One run at a
time per controller; only the leader runs one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from llmgw.adapters.secrets import SecretError
from llmgw.adapters.ssh import wheels
from llmgw.adapters.ssh.bootstrap import NodeResult
from llmgw.adapters.ssh.remote import StepFailed, target_for
from llmgw.adapters.ssh.render import Layout
from llmgw.adapters.ssh.upgrade import UpgradeOptions, upgrade_node
from llmgw.controller.api.audited import AUDIT_OBJECT
from llmgw.controller.parts.fleet import FleetActor
from llmgw.controller.parts.hub import AgentHub

if TYPE_CHECKING:
    from llmgw.controller.parts.hub import NodeLink

log = logging.getLogger("llmgw.controller.upgrade")

NOT_MANAGED = "not managed by llmgw (not a remote Node bootstrapped over SSH): upgrade it yourself"


class UpgradeParts(FleetActor, Protocol):
    """What an upgrade reads besides a FleetActor: the hub's own links (an agent back on its new version)."""

    @property
    def hub(self) -> AgentHub: ...


PARTS: web.AppKey[UpgradeParts] = web.AppKey("upgrade_parts")


@dataclass(frozen=True)
class UpgradeOrder:
    """Which nodes an upgrade touches and in what batches, and which it cannot."""

    batches: tuple[tuple[str, ...], ...]
    not_managed: tuple[str, ...]
    unknown: tuple[str, ...]


def upgrade_order(asked: list[str] | None, managed: set[str], known: set[str], parallel: int) -> UpgradeOrder:
    """Pure: `asked` (None: every node) split into batches of `parallel` managed nodes, in name order."""
    names = sorted(set(asked) if asked is not None else managed | known)
    unknown = tuple(n for n in names if n not in managed and n not in known)
    ours = [n for n in names if n in managed]
    step = max(1, parallel)
    return UpgradeOrder(
        batches=tuple(tuple(ours[i : i + step]) for i in range(0, len(ours), step)),
        not_managed=tuple(n for n in names if n in known and n not in managed),
        unknown=unknown,
    )


def _bad(message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request"}}, status=400)


@dataclass(frozen=True)
class UpgradeRequest:
    nodes: list[str] | None  # None: every node
    parallel: int
    wheelhouse: Path | None  # None: the controller's own
    timeout_s: float | None  # None: the controller's node_register_timeout_s


FIELDS = ("nodes", "parallel", "wheelhouse", "timeout_s")


def parse_request(body: Any) -> UpgradeRequest | str:
    """The request, or what is wrong with it."""
    if not isinstance(body, dict):
        return (
            "the body must be a JSON object: {nodes?: [names], parallel?: N, wheelhouse?: DIR, timeout_s?: S}"
        )
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        return f"unknown field(s) {', '.join(unknown)} ({', '.join(FIELDS)})"
    nodes = body.get("nodes")
    if nodes is not None and (not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes)):
        return "nodes must be a list of node names"
    parallel = body.get("parallel", 1)
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        return f"parallel must be a whole number of nodes at a time, 1 or more (got {parallel!r})"
    house = body.get("wheelhouse")
    if house is not None and (not isinstance(house, str) or not os.path.isabs(house)):
        return "wheelhouse must be an absolute directory on the controller's machine"
    timeout = body.get("timeout_s")
    if timeout is not None and (
        not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 0 < timeout <= 3600
    ):
        return f"timeout_s must be seconds to wait for each agent, above 0 and at most 3600 (got {timeout!r})"
    return UpgradeRequest(nodes, parallel, Path(house) if house else None, timeout)


async def upgrade(request: web.Request) -> web.Response:
    c = request.app[PARTS]
    try:
        body = await request.json()
    except ValueError:
        return _bad("the body is not JSON")
    asked = parse_request(body)
    if isinstance(asked, str):
        return _bad(asked)
    request[AUDIT_OBJECT] = ",".join(asked.nodes) if asked.nodes else "all nodes"
    d = c.desired
    if d is None or not c.leading():
        return web.json_response(
            {"error": {"message": "this controller is not the leader, or has no applied revision yet"}},
            status=409,
        )
    managed = {n for n, e in d.catalog.nodes.items() if not e.spec.local}
    order = upgrade_order(asked.nodes, managed, set(c.hub.nodes) | set(d.catalog.nodes), asked.parallel)
    if order.unknown:
        return _bad(f"unknown node(s) {', '.join(order.unknown)}; `llmgw nodes` lists them")
    lock = c.fleet.nodes.upgrade_lock
    if lock.locked():
        return web.json_response({"error": {"message": "an upgrade is already running"}}, status=409)
    async with lock:
        try:
            house = await asyncio.to_thread(_wheelhouse, c, asked.wheelhouse)
        except wheels.WheelhouseError as exc:
            return _bad(str(exc))
        nodes = await _run(c, order, house, asked.timeout_s or c.settings.node_register_timeout_s)
    ok = all(n["status"] in ("upgraded", "unchanged", "not_managed") for n in nodes)
    answer = {"ok": ok, "agent_version": house.agent_version, "wheelhouse": house.digest, "nodes": nodes}
    return web.json_response(answer)


def _wheelhouse(c: UpgradeParts, asked: Path | None) -> wheels.Wheelhouse:
    """The wheelhouse named, the controller's prebuilt one, or one built from the agent source beside it."""
    if asked is not None:
        return wheels.load(asked)
    if c.settings.wheelhouse is not None:
        return wheels.load(c.settings.wheelhouse)
    return wheels.build(c.settings.state_dir / "wheelhouse")


async def _run(
    c: UpgradeParts, order: UpgradeOrder, house: wheels.Wheelhouse, wait_s: float
) -> list[dict[str, Any]]:
    out = [
        {"node": n, "status": "not_managed", "message": NOT_MANAGED, "steps": []} for n in order.not_managed
    ]
    failed = False
    for batch in order.batches:
        if failed:
            out += [_entry(n, "not_attempted", "an earlier node failed; not touched") for n in batch]
            continue
        results = await asyncio.gather(*(_one(c, n, house, wait_s) for n in batch))
        out += results
        failed = any(r["status"] == "failed" for r in results)
    return sorted(out, key=lambda e: e["node"])


def _entry(node: str, status: str, message: str, **more: Any) -> dict[str, Any]:
    return {"node": node, "status": status, "message": message, "steps": [], **more}


async def _one(c: UpgradeParts, node: str, house: wheels.Wheelhouse, wait_s: float) -> dict[str, Any]:
    d = c.desired
    entry = d.catalog.nodes.get(node) if d is not None else None
    link = c.hub.nodes.get(node)
    if d is None or entry is None:
        return _entry(node, "failed", "no longer declared in the applied revision")
    if link is None or not link.connected or link.state != "Ready":
        return _entry(node, "failed", "its agent is not connected and Ready: bootstrap brings it back first")
    before_version = link.agent_version
    engines = {sid: s.pid for sid, s in link.shards.items() if s.pid is not None}
    try:
        target = target_for(entry.document(), d.root, os.environ, secrets=c.settings.secret_policy())
    except (StepFailed, SecretError) as exc:
        return _entry(node, "failed", str(exc))

    async def came_back(name: str, since: float, version: str | None) -> str | None:
        return back_problem(c.hub.nodes.get(name), since, version, engines)

    await c.event("node_upgrade", node, f"llmgw-agent {before_version} -> {house.agent_version}")
    opts = UpgradeOptions(
        wheelhouse=house,
        came_back=came_back,
        old_version=before_version,
        layout=Layout(prefix=c.settings.node_prefix),
        service=c.settings.node_service,
        timeout=wait_s,
        rollback_timeout=max(wait_s, c.settings.node_register_timeout_s),
    )
    op = c.fleet.nodes.ops_for(node)
    op.upgrading = True
    try:
        result = await upgrade_node(target, opts)
    finally:
        op.upgrading = False
    return await _reported(c, result, before_version, house)


async def _reported(
    c: UpgradeParts, result: NodeResult, before: str, house: wheels.Wheelhouse
) -> dict[str, Any]:
    node = result.node
    steps = [{"step": s.name, "status": s.status, "detail": s.detail} for s in result.steps]
    link = c.hub.nodes.get(node)
    after = link.agent_version if link is not None else None
    versions = {"version_before": before, "version_after": after}
    if not result.ok:
        failed = next(s for s in result.steps if s.status == "failed")
        rolled = next((s for s in result.steps if s.name == "rollback"), None)
        message = f"{failed.name}: {failed.detail}" + (f"; rollback: {rolled.detail}" if rolled else "")
        log.warning("upgrade of node %s failed: %s", node, message)
        await c.event("node_upgrade_failed", node, message)
        return _entry(node, "failed", message, **versions) | {"steps": steps}
    if not result.changed:
        return _entry(
            node, "unchanged", f"already runs this wheelhouse (llmgw-agent {after})", **versions
        ) | {"steps": steps}
    message = f"llmgw-agent {before} -> {after}, engines adopted"
    await c.event("node_upgraded", node, message)
    return _entry(node, "upgraded", message, **versions) | {"steps": steps}


def back_problem(
    link: NodeLink | None, since: float, version: str | None, engines: dict[str, int]
) -> str | None:
    """None when the node's agent registered at or after `since`, is Ready, runs `version` (None: any) and
    reports every engine of `engines` (shard id -> pid) under the same pid; else what is still missing."""
    if link is None or not link.connected or link.connected_at < since:
        return "it has not registered again"
    if link.state != "Ready":
        return f"it is {link.state}"
    if version is not None and link.agent_version != version:
        return f"it runs llmgw-agent {link.agent_version}, not {version}"
    lost = sorted(sid for sid, pid in engines.items() if (s := link.shards.get(sid)) is None or s.pid != pid)
    if lost:
        return f"engine(s) not adopted under their pids yet: {', '.join(lost)}"
    return None
