"""The Cluster's engine installs, told to every connected agent: on connect, and when a revision changes them.

An agent converges on what it is told (llmgw_agent.installs) and says how it went in its inventory (engines
it reports, conditions of those that failed). The controller only keeps which orders each link was sent, so a
reconnected agent (a new link) and a changed revision are told again, and nothing is sent twice otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from llmgw_agent.protocol import Command, EngineOrder, Inventory

from llmgw.controller.parts.hub import AgentError
from llmgw.core.config.models import EngineInstallSettings, EngineName, EngineSettings
from llmgw.core.placement.engine_builds import BuildChoice, default_check
from llmgw.core.words import parse_duration

if TYPE_CHECKING:
    from llmgw.controller.parts.background import Background
    from llmgw.controller.parts.hub import AgentClient

log = logging.getLogger("llmgw.controller.engines")
SEND_WAIT_S = 15.0


def _install_fields(
    engine: str, version: str | None, path: str | None, i: EngineInstallSettings | None
) -> dict[str, object]:
    fields: dict[str, object] = {"engine": engine, "version": version, "path": path}
    if i is not None:
        fields |= {
            "requirements": i.requirements,
            "find_links": i.find_links,
            "index_url": i.index_url,
            "extra_index_url": i.extra_index_url,
            "no_deps": i.no_deps,
            "binary": i.binary if i.archive is None else i.archive.binary,
            "locate": i.locate,
            "archive_url": i.archive.url if i.archive else None,
            "archive_sha256": i.archive.sha256 if i.archive else None,
            "probe_timeout_s": parse_duration(i.probe_timeout),
        }
    return fields


def engine_orders(
    engines: Mapping[EngineName, EngineSettings], choices: Mapping[str, BuildChoice] | None = None
) -> list[EngineOrder]:
    """One order per engine the Cluster says how to obtain (`path` or `install`, or the node's build of its
    `builds`: `choices`, llmgw.core.placement.engine_builds); others are the agent's. An engine with builds
    but none for this node (refused, disabled) is not ordered: placement says why it is not there."""
    orders: list[EngineOrder] = []
    for name, s in sorted(engines.items()):
        if s.builds:
            choice = (choices or {}).get(name)
            build = choice.build if choice is not None else None
            if build is None:
                continue
            fields = _install_fields(name, s.version, build.path, build.install) | {"build": build.name}
            check = default_check(name, build)
            if check is not None:
                fields |= {
                    "check_argv": check.argv,
                    "check_expect": check.expect,
                    "check_timeout_s": parse_duration(check.timeout),
                }
            orders.append(EngineOrder.model_validate(fields))
            continue
        if s.path is None and s.install is None:
            continue
        orders.append(EngineOrder.model_validate(_install_fields(name, s.version, s.path, s.install)))
    return orders


def orders_digest(orders: list[EngineOrder]) -> str:
    text = json.dumps([o.model_dump(mode="json") for o in orders], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class EngineOrders:
    """Which orders each link (node, connected_at) was sent."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[float, str]] = {}

    def send_due(
        self,
        agents: AgentClient,
        engines: Mapping[EngineName, EngineSettings],
        background: Background,
        choices: Callable[[str, Inventory], Mapping[str, BuildChoice]] = lambda _n, _i: {},
    ) -> None:
        """Tell each connected node its orders when they changed: its own, where an engine has builds
        (`choices`: node name and inventory -> its build of each engine)."""
        for name, link in agents.nodes.items():
            orders = engine_orders(engines, choices(name, link.inventory))
            digest = orders_digest(orders)
            if not link.connected or self.sent.get(name) == (link.connected_at, digest):
                continue
            if not orders and name not in self.sent:
                continue  # nothing was ever ordered: the agent's own configuration stands
            self.sent[name] = (link.connected_at, digest)
            background.spawn(self._send(agents, name, orders))

    async def _send(self, agents: AgentClient, node: str, orders: list[EngineOrder]) -> None:
        cmd = Command(id=uuid.uuid4().hex[:12], action="install_engines", engines=orders)
        try:
            reply = await agents.command(node, cmd, SEND_WAIT_S)
        except AgentError as exc:
            log.warning("telling node %s its engines failed: %s (told again when it reconnects)", node, exc)
            self.sent.pop(node, None)
            return
        if not reply.ok:  # an agent too old for the command: it keeps its own configuration
            log.warning("node %s did not take its engine orders: %s", node, reply.error or "no reason given")
