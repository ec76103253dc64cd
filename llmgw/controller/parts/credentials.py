"""Who may connect where: the credentials of nodes and routers, and the node token generations.

- A node's agent presents its node token (`llmgw.core.security.node_token`, issued by bootstrap): it opens the agent
  hub for that node name only, never the router stream (which carries every engine key).
- Routers present the router token (`llmgw.core.security.router_token`) on `/router/v1` and the routers' HTTP
  signals; with a cluster CA they also need a client certificate of the router role.
- The operator's admin token opens both (an admin can change the whole fleet anyway).
- The Cluster's shared `spec.controller.token`, when declared, opens the agent hub for any node name (for
  agents an operator installs by hand); it is no router credential.

Tearing a node down bumps its generation (kept in STATE_DIR/node-generations.json), so the token the removed
machine holds is refused from then on, even if a node of that name is declared again later.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from llmgw.core.config.models import NAME_PATTERN
from llmgw.core.security import NODE_TOKEN_PREFIX, is_loopback_host, node_token, router_token

log = logging.getLogger("llmgw.controller.parts.credentials")

_NAME = re.compile(NAME_PATTERN)
GENERATIONS_FILE = "node-generations.json"


def valid_node_name(name: str) -> str | None:
    """None when `name` may name a node (the repo's NAME_PATTERN), else why not."""
    if _NAME.fullmatch(name):
        return None
    return (
        f"node name {name[:80]!r} is not a valid name (lower-case letters, digits, '.', '_' and '-', "
        "at most 63, starting and ending with a letter or digit)"
    )


def loopback_address(address: str) -> bool:
    """Whether `host:port` names this machine only (agents dialling it never cross a network)."""
    return is_loopback_host(_host(address))


def _host(address: str) -> str:
    """The host of `host:port`, `[v6]:port` or a bare host (as llmgw.adapters.ssh.ca.split_host)."""
    if address.startswith("["):
        return address[1 : address.index("]")]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def same(presented: str, expected: str) -> bool:
    return hmac.compare_digest(presented.encode(), expected.encode())


@dataclass(frozen=True)
class Grant:
    """What a bearer token presented to the agent hub allows: any node name (admin or the shared Cluster
    token), or only the node whose token it is (checked once the agent says its name)."""

    any_node: bool


def hub_grant(presented: str, *, admin: str, shared: str | None) -> Grant | None:
    """Before the agent registers: None when the token cannot be any credential the hub accepts."""
    if same(presented, admin) or (shared is not None and same(presented, shared)):
        return Grant(any_node=True)
    if presented.startswith(NODE_TOKEN_PREFIX):
        return Grant(any_node=False)
    return None


def node_token_refusal(presented: str, node: str, secret: bytes, generation: int) -> str | None:
    """After Register: None when `presented` is node `node`'s token of its current generation."""
    if same(presented, node_token(secret, node, generation)):
        return None
    return f"this token is not node {node!r}'s (a node token opens the hub for its own node only)"


class NodeTokenIndex:
    """Which declared node a presented node token is, with no node name to go by (the mirror's readers say
    none): a table from each current token's SHA-256 to its node, built once per cluster secret and set of
    (node, generation), so an unknown token costs one digest and a lookup, not one HMAC per declared node."""

    def __init__(self) -> None:
        self._built_for: tuple[bytes, tuple[tuple[str, int], ...]] | None = None
        self._nodes: dict[bytes, str] = {}

    def node_of(self, presented: str, secret: bytes, generations: tuple[tuple[str, int], ...]) -> str | None:
        if self._built_for != (secret, generations):
            self._nodes = {_digest(node_token(secret, node, gen)): node for node, gen in generations}
            self._built_for = (secret, generations)
        return self._nodes.get(_digest(presented))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def router_token_ok(presented: str, *, admin: str, secret: bytes | None) -> bool:
    if same(presented, admin):
        return True
    return secret is not None and same(presented, router_token(secret))


class NodeGenerations:
    """Per-node token generations, in a small JSON file in the state dir (0 for a node never torn down)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._values: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._values is None:
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self._values = {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}
            except FileNotFoundError:
                self._values = {}
            except (OSError, ValueError) as exc:
                # Refusing every node would be an outage; starting from 0 re-admits torn-down nodes. Neither is
                # silent: say it, and keep the file for the operator to look at.
                log.error("cannot read %s (%s): node token generations start from 0", self.path, exc)
                self._values = {}
        return self._values

    def get(self, node: str) -> int:
        return self._load().get(node, 0)

    def bump(self, node: str) -> int:
        """The node is torn down: its current token stops working. Returns the new generation."""
        values = self._load()
        values[node] = values.get(node, 0) + 1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(values, f, sort_keys=True)
        tmp.replace(self.path)
        return values[node]
