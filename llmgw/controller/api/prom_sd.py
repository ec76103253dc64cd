"""`GET /api/v1/prometheus/targets`: the fleet as Prometheus http_sd JSON, so one scrape config finds it all.

Three kinds of target, told apart by the `llmgw_component` label (relabel on it to route them to jobs):
- `controller`: this controller's metrics listener;
- `router`: every router subscribed to this controller's stream, at the address it connected from and the
  port the Cluster's `spec.router.metrics_listen` declares (a router does not tell its metrics address; one
  behind NAT or with another listen port is found wrongly, say so in its static config instead);
- `agent`: every connected agent that opened a node-health listener (`metrics_listen`), at the address it
  registered with, one group per node labelled `llmgw_node`.
Not targets: engines (the routers scrape those and export what scheduling reads; an engine may demand its key
on /metrics, which Prometheus must not hold). Only the leader knows the routers and agents: a standby answers
its own listener alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

from aiohttp import web

from llmgw.controller.api.guard import require_parts
from llmgw.controller.parts.desired import Desired
from llmgw.controller.parts.hub import AgentHub

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class PromSdParts(Protocol):
    """What the targets are read from: the metrics listener, the applied revision (the routers' metrics port),
    whether this controller leads, the routers' addresses and the hub's links."""

    @property
    def metrics_address(self) -> tuple[str, int] | None: ...

    @property
    def desired(self) -> Desired | None: ...

    @property
    def router_peers(self) -> Mapping[web.WebSocketResponse, str]: ...

    @property
    def hub(self) -> AgentHub: ...

    def leading(self) -> bool: ...


PARTS: web.AppKey[PromSdParts] = web.AppKey("prom_sd_parts")


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _port_of(listen: str) -> int | None:
    _, sep, port = listen.rpartition(":")
    return int(port) if sep and port.isdigit() else None


def target_groups(c: PromSdParts, asked_host: str) -> list[dict[str, Any]]:
    """The http_sd groups; `asked_host` replaces a wildcard bind address (the host Prometheus asked)."""
    groups: list[dict[str, Any]] = []
    if c.metrics_address is not None:
        host, port = c.metrics_address
        host = asked_host if host in WILDCARD_HOSTS else host
        groups.append({"targets": [_hostport(host, port)], "labels": {"llmgw_component": "controller"}})
    d = c.desired
    if not c.leading() or d is None:
        return groups
    router_port = _port_of(d.cluster.router.metrics_listen)
    peers = sorted({p for p in c.router_peers.values() if p})
    if router_port is not None and peers:
        groups.append(
            {"targets": [_hostport(p, router_port) for p in peers], "labels": {"llmgw_component": "router"}}
        )
    for name, link in sorted(c.hub.nodes.items()):
        if link.connected and link.metrics_address:
            groups.append(
                {
                    "targets": [link.metrics_address],
                    "labels": {"llmgw_component": "agent", "llmgw_node": name},
                }
            )
    return groups


async def prometheus_targets(request: web.Request) -> web.Response:
    c = require_parts(request, "plan", PARTS)
    asked = urlsplit(f"//{request.host}").hostname or "127.0.0.1"
    return web.json_response(target_groups(c, asked))
