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
from collections.abc import Mapping
from typing import TYPE_CHECKING

from llmgw_agent.protocol import Command, EngineOrder

from llmgw.controller.parts.hub import AgentError
from llmgw.core.config.models import EngineName, EngineSettings
from llmgw.core.words import parse_duration

if TYPE_CHECKING:
    from llmgw.controller.parts.background import Background
    from llmgw.controller.parts.hub import AgentClient

log = logging.getLogger("llmgw.controller.engines")
SEND_WAIT_S = 15.0


def engine_orders(engines: Mapping[EngineName, EngineSettings]) -> list[EngineOrder]:
    """One order per engine the Cluster says how to obtain (`path` or `install`); others are the agent's."""
    orders: list[EngineOrder] = []
    for name, s in sorted(engines.items()):
        if s.path is None and s.install is None:
            continue
        fields: dict[str, object] = {"engine": name, "version": s.version, "path": s.path}
        if s.install is not None:
            i = s.install
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
        orders.append(EngineOrder.model_validate(fields))
    return orders


def orders_digest(orders: list[EngineOrder]) -> str:
    text = json.dumps([o.model_dump(mode="json") for o in orders], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class EngineOrders:
    """Which orders each link (node, connected_at) was sent."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[float, str]] = {}

    def send_due(
        self, agents: AgentClient, engines: Mapping[EngineName, EngineSettings], background: Background
    ) -> None:
        orders = engine_orders(engines)
        digest = orders_digest(orders)
        for name, link in agents.nodes.items():
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
