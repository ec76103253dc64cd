"""`GET /api/v1/doctor` and `POST /api/v1/nodes/{node}/doctor`: the controller's and a node's health checks.

The controller's: the store answers, the cluster repo is read and applied, the certificate files it serves or
trusts are valid and not near expiry, routers are subscribed, agents connected. A node's: the agent runs its
own checks (llmgw_agent.doctor, the `doctor` command) and the controller adds what it sees of the node (its
clock offset on heartbeats, whether it is connected). The decisions are llmgw.core.fleet.health's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from llmgw_agent.protocol import Command

from llmgw.adapters.cert_files import not_after
from llmgw.controller.api.audited import AUDIT_OBJECT
from llmgw.controller.api.guard import require_parts
from llmgw.controller.parts.desired import Desired
from llmgw.controller.parts.hub import AgentError, AgentHub
from llmgw.controller.parts.settings import ControllerOptions
from llmgw.controller.parts.state import RefusedRevision
from llmgw.core.fleet import health
from llmgw.core.words import short
from llmgw.store import StoreError
from llmgw.store.store import Store

STORE_TIMEOUT_S = 5.0
NODE_DOCTOR_WAIT_S = 120.0  # each engine probe is bounded at 30s by the agent


class DoctorParts(Protocol):
    """What the checks read: the store, the settings (the certificate files), the hub's links, the revision
    pipeline's state, the router sockets, whether this controller leads, and the wall clock."""

    @property
    def store(self) -> Store: ...

    @property
    def settings(self) -> ControllerOptions: ...

    @property
    def hub(self) -> AgentHub: ...

    @property
    def desired(self) -> Desired | None: ...

    @property
    def refused(self) -> RefusedRevision | None: ...

    @property
    def source_error(self) -> str | None: ...

    @property
    def router_sockets(self) -> set[web.WebSocketResponse]: ...

    @property
    def wall(self) -> Callable[[], float]: ...

    def leading(self) -> bool: ...


PARTS: web.AppKey[DoctorParts] = web.AppKey("doctor_parts")


async def _store(c: DoctorParts) -> health.Check:
    try:
        async with asyncio.timeout(STORE_TIMEOUT_S):
            version = await c.store.schema_version()
    except TimeoutError:
        return health.store_check(f"no answer within {STORE_TIMEOUT_S:.0f}s", None)
    except StoreError as exc:
        return health.store_check(str(exc), None)
    return health.store_check(None, version)


def certificate_files(c: DoctorParts) -> list[tuple[str, Path]]:
    """(what, path) of each certificate the controller serves with or trusts."""
    s = c.settings
    files = [("tls_cert", s.tls_cert), ("tls_client_ca", s.tls_client_ca)]
    found = [(what, path) for what, path in files if path is not None]
    if s.ca_dir is not None and s.ca_dir.is_dir():
        found += [(f"cluster CA {p.name}", p) for p in sorted(s.ca_dir.glob("*.crt"))]
    return found


def _agents(c: DoctorParts) -> health.Check:
    links = c.hub.nodes.values()
    lost = sorted(n.name for n in links if n.state == "Lost")
    away = sorted(n.name for n in links if n.state == "Unreachable")
    ready = sum(1 for n in links if n.connected and n.state == "Ready")
    if lost or away:
        names = ", ".join([*(f"{n} (Lost)" for n in lost), *(f"{n} (Unreachable)" for n in away)])
        return health.Check(
            "agents",
            "fail" if lost else "warn",
            f"{ready} agent(s) connected; not heard from: {names}",
            "on each node, check the agent runs (`journalctl -u llmgw-agent`) and reaches this controller; "
            "`llmgw doctor NODE` once it is back",
        )
    return health.Check("agents", "ok", f"{ready} agent(s) connected")


async def controller_checks(c: DoctorParts) -> list[health.Check]:
    now = c.wall()
    refused = c.refused
    checks = [
        await _store(c),
        health.source_check(
            c.source_error,
            short(c.desired.revision) if c.desired is not None else None,
            short(refused.revision) if refused is not None else None,
            refused.errors if refused is not None else (),
        ),
    ]
    for what, path in certificate_files(c):
        expiry, error = await asyncio.to_thread(not_after, path)
        checks.append(health.certificate_check(what, expiry, error, now))
    checks.append(health.routers_check(len(c.router_sockets), c.leading()))
    checks.append(_agents(c))
    return checks


def _answer(subject: str, checks: list[dict[str, Any]], **extra: Any) -> web.Response:
    statuses = {ch["status"] for ch in checks}
    worst = "fail" if "fail" in statuses else "warn" if "warn" in statuses else "ok"
    return web.json_response({"subject": subject, "status": worst, "checks": checks, **extra})


async def controller_doctor(request: web.Request) -> web.Response:
    c = require_parts(request, "plan", PARTS)
    return _answer("controller", [ch.as_json() for ch in await controller_checks(c)])


async def node_doctor(request: web.Request) -> web.Response:
    c = require_parts(request, "plan", PARTS)
    node = request.match_info["node"]
    request[AUDIT_OBJECT] = node
    link = c.hub.nodes.get(node)
    if link is None or not link.connected:
        known = ", ".join(sorted(c.hub.nodes)) or "none"
        state = "not connected" if link is not None else "unknown"
        check = health.Check(
            "agent",
            "fail",
            f"node {node} is {state} (connected nodes: {known})",
            "start its agent (`systemctl start llmgw-agent`) and check it reaches this controller; "
            "`llmgw nodes` shows when it was last seen",
        )
        return _answer(node, [check.as_json()])
    command = Command(id=uuid.uuid4().hex[:12], action="doctor", controller_time=c.wall())
    try:
        reply = await c.hub.command(node, command, NODE_DOCTOR_WAIT_S)
    except AgentError as exc:
        check = health.Check(
            "agent",
            "fail",
            str(exc),
            "an agent older than `doctor` ignores it: bootstrap the node again (`llmgw node bootstrap NODE`)",
        )
        return _answer(node, [check.as_json()])
    if not reply.ok:
        check = health.Check(
            "agent", "fail", f"the agent refused doctor: {reply.error}", "bootstrap the node again"
        )
        return _answer(node, [check.as_json()])
    checks = list(reply.payload.get("checks", []))
    checks.append(health.clock_check(node, link.clock_offset).as_json())
    return _answer(node, checks, agent_version=link.agent_version)
