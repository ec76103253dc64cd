"""The agent hub: the WebSocket agents connect to, node liveness, and commands with replies.

One record per node (`NodeLink`); the hub never decides anything about replicas, it only reports what agents
say (`on_change` is called after every state change so the reconciler can run) and carries commands out.
Node liveness has two stages far apart: Unreachable after `unreachable_after` without a heartbeat (replicas
kept, nothing new placed there), Lost after `lost_after` (its replicas are given up and placed elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import WSMsgType, web
from llmgw_agent.protocol import (
    PROTOCOL_VERSION,
    Command,
    Heartbeat,
    Inventory,
    NodeThermals,
    Refused,
    Register,
    Reply,
    ShardSpec,
    ShardStatus,
    ShardUpdate,
    Welcome,
    dump,
    parse_agent_message,
)
from pydantic import ValidationError

from llmgw.adapters import logformat
from llmgw.controller.parts.background import Background
from llmgw.controller.parts.credentials import Grant, valid_node_name
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.health import CLOCK_SAMPLES, clock_offset
from llmgw.core.fleet.states import NodeState
from llmgw.core.security import bearer_token

log = logging.getLogger("llmgw.controller.parts.hub")

REGISTER_TIMEOUT_S = 10.0
MAX_NODES = 4096  # links kept at once; a flood of made-up names past this is refused


class AgentError(LlmgwError):
    """A command could not be carried out on a node (not connected, refused, timed out)."""


@dataclass
class NodeLink:
    """What the controller knows of one node, as its agent last said."""

    name: str
    inventory: Inventory
    agent_version: str
    address: str
    connected_at: float
    last_seen: float
    state: NodeState = "Ready"
    shards: dict[str, ShardStatus] = field(default_factory=dict)
    ws: web.WebSocketResponse | None = None
    pending: dict[str, asyncio.Future[Reply]] = field(default_factory=dict)
    registered_shards: tuple[str, ...] = ()  # shard ids the agent reported at its last Register
    metrics_address: str | None = None  # the agent's node-health listener, host:port (None: it has none)
    thermals: NodeThermals | None = None  # heat and power, the agent's last sample (None: none sent yet)
    # `agent sent_at - controller received_at` of the last heartbeats (llmgw.core.fleet.health.clock_offset).
    clock_samples: deque[float] = field(default_factory=lambda: deque(maxlen=CLOCK_SAMPLES))

    @property
    def connected(self) -> bool:
        return self.ws is not None and not self.ws.closed

    @property
    def clock_offset(self) -> float | None:
        """The node's clock minus the controller's, in seconds; None before a heartbeat that says its time."""
        return clock_offset(self.clock_samples)


@dataclass(frozen=True)
class HubTimings:
    heartbeat_interval_s: float
    unreachable_after_s: float
    lost_after_s: float


class AgentClient(Protocol):
    """What the reconcile loop needs of the agents: the links they keep, and two commands.

    `AgentHub` is the real one (a WebSocket server); tests/controller/fake_agents.py fakes it without sockets.
    A command raises `AgentError` when it cannot be carried out (not connected, refused, timed out)."""

    nodes: dict[str, NodeLink]
    on_register: Callable[[NodeLink, Register], None] | None

    async def start_shard(self, node: str, spec: ShardSpec, wait_s: float) -> Reply: ...

    async def stop_shard(self, node: str, replica_id: str, rank: int, wait_s: float) -> Reply: ...

    async def command(self, node: str, command: Command, wait_s: float) -> Reply: ...


class AgentHub:
    """Owns the node links. `clock` is monotonic seconds.

    `grant(token)` says what a presented bearer token may do before the agent names itself (None: nothing);
    `node_check(token, node)` then says why a token that opens one node only is not `node`'s (None: it is).
    """

    def __init__(
        self,
        *,
        grant: Callable[[str], Grant | None],
        node_check: Callable[[str, str], str | None],
        timings: Callable[[], HubTimings],
        clock: Callable[[], float],
        on_change: Callable[[str], None],
        peer_check: Callable[[bytes | None], str] | None = None,
        declared: Callable[[], Collection[str]] = frozenset,
        gate: Callable[[], str | None] | None = None,
        max_nodes: int = MAX_NODES,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._grant = grant
        self._wall = wall  # Unix time, to compare with the time agents say they sent at
        self._node_check = node_check
        self._timings = timings
        self._clock = clock
        self._on_change = on_change
        # With mutual TLS: the node name a client certificate proves, or PeerRejected/ValueError with why not.
        self._peer_check = peer_check
        self._declared = declared  # Nodes of the applied revision: their links are kept however long silent
        self.max_nodes = max_nodes
        self.nodes: dict[str, NodeLink] = {}
        # Called with each link as its agent registers (app.py wires the reconcile loop's adoption here).
        self.on_register: Callable[[NodeLink, Register], None] | None = None
        self.closing = False
        # With ha: why this controller refuses agents now (a standby), or None; see llmgw.controller.parts.lease.
        self.gate = gate
        self.background = Background("hub")  # closing replaced links, sending welcomes: awaited by close()

    # ---------------------------------------------------------------------------------- connection

    def authorised(self, request: web.Request) -> tuple[str, Grant] | str:
        """The token and what it allows when the agent may go on to register, else why not (said to it)."""
        presented = bearer_token(request.headers.get("Authorization"))
        if presented is None:
            return "missing Authorization: Bearer <token>"
        grant = self._grant(presented)
        if grant is None:
            return "wrong token"
        return presented, grant

    def _name_refusal(self, node: str, presented: str, grant: Grant) -> str | None:
        """Why an agent authorised with `grant` may not register as `node`, or None."""
        bad = valid_node_name(node)
        if bad is not None:
            return bad
        if not grant.any_node:
            refusal = self._node_check(presented, node)
            if refusal is not None:
                return refusal
        if node not in self.nodes and len(self.nodes) >= self.max_nodes:
            return f"the controller already knows {len(self.nodes)} nodes (its limit); refusing a new one"
        return None

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=16 * 1024 * 1024)
        await ws.prepare(request)
        peer = request.remote or "?"
        auth = "the controller is stopping" if self.closing else self.authorised(request)
        if isinstance(auth, str):
            log.warning("agent from %s refused: %s", peer, auth)
            await self._refuse(ws, auth)
            return ws
        register = await self._receive_register(ws, peer)
        if register is None:
            return ws
        refusal = self._name_refusal(register.node, *auth) or self._certificate_refusal(
            request, register.node
        )
        if refusal is not None:
            log.warning("agent %r from %s refused: %s", register.node[:80], peer, refusal)
            await self._refuse(ws, refusal)
            return ws
        # Only now, the agent's credential checked for the name it gave, may a standby say who leads.
        standby = self.gate() if self.gate is not None else None
        if standby is not None:
            log.info("agent %s from %s refused: %s", register.node, peer, standby)  # a standby's normal work
            await self._refuse(ws, standby)
            return ws
        link = self._attach(register, ws, peer)
        logformat.bind(node=link.name)  # what this connection's task logs is about that node
        try:
            await self._serve(link, ws)
        finally:
            self._detach(link, ws)
        return ws

    def _certificate_refusal(self, request: web.Request, node: str) -> str | None:
        """With mutual TLS, the certificate must name the node the agent registers as (and not be revoked)."""
        if self._peer_check is None:
            return None
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        try:
            named = self._peer_check(der)
        except (LlmgwError, ValueError, OSError) as exc:  # PeerRejected, CAError, a malformed certificate
            return f"client certificate refused: {exc}"
        if named != node:
            return f"the client certificate is for node {named!r}, not {node!r}"
        return None

    async def _receive_register(self, ws: web.WebSocketResponse, peer: str) -> Register | None:
        try:
            msg = await ws.receive(timeout=REGISTER_TIMEOUT_S)
        except TimeoutError:
            await self._refuse(ws, "no register message within 10s")
            return None
        if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return None
        try:
            first = parse_agent_message(msg.data)
        except ValidationError as exc:
            await self._refuse(ws, f"first message is not a valid register: {exc.errors()[0]['msg']}")
            return None
        if not isinstance(first, Register):
            await self._refuse(ws, f"first message must be register, got {first.type}")
            return None
        if first.protocol_version != PROTOCOL_VERSION:
            await self._refuse(
                ws,
                f"protocol version {first.protocol_version} not supported; this controller speaks {PROTOCOL_VERSION}",
            )
            return None
        log.info("agent %r registered from %s with %d shard(s)", first.node[:80], peer, len(first.shards))
        return first

    async def _refuse(self, ws: web.WebSocketResponse, reason: str) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(dump(Refused(reason=reason)))
        await ws.close()

    def _attach(self, register: Register, ws: web.WebSocketResponse, peer: str) -> NodeLink:
        now = self._clock()
        old = self.nodes.get(register.node)
        if old is not None and old.ws is not None and old.ws is not ws:
            # A reconnect replaces the old link (the agent restarted, or the network came back).
            self._fail_pending(old, "the agent reconnected")
            self.background.spawn(old.ws.close())
        link = NodeLink(
            name=register.node,
            inventory=register.inventory,
            agent_version=register.agent_version,
            address=peer,
            connected_at=now,
            last_seen=now,
            shards={s.shard_id: s for s in register.shards},
            ws=ws,
            registered_shards=tuple(s.shard_id for s in register.shards),
            metrics_address=register.metrics_address,
        )
        self._clock_sample(link, register.sent_at)
        self.nodes[register.node] = link
        if self.on_register is not None:
            self.on_register(link, register)
        self.background.spawn(
            ws.send_str(dump(Welcome(heartbeat_interval_s=self._timings().heartbeat_interval_s)))
        )
        self._on_change(f"node {register.node} registered")
        return link

    async def _serve(self, link: NodeLink, ws: web.WebSocketResponse) -> None:
        async for msg in ws:
            if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue
            try:
                message = parse_agent_message(msg.data)
            except ValidationError as exc:
                log.warning("node %s sent an invalid message: %s", link.name, exc.errors()[0]["msg"])
                continue
            if self.nodes.get(link.name) is not link:
                return  # replaced by a newer connection
            self._receive(link, message)

    def _receive(self, link: NodeLink, message: Register | Heartbeat | ShardUpdate | Reply) -> None:
        link.last_seen = self._clock()
        came_back = link.state != "Ready"
        link.state = "Ready"
        if isinstance(message, Heartbeat):
            self._clock_sample(link, message.sent_at)
            before = {k: (s.state, s.pid) for k, s in link.shards.items()}
            link.shards = {s.shard_id: s for s in message.shards}
            if message.inventory is not None:
                link.inventory = message.inventory
            if message.thermals is not None:
                link.thermals = message.thermals
            if came_back or before != {k: (s.state, s.pid) for k, s in link.shards.items()}:
                self._on_change(f"node {link.name} heartbeat changed shards")
        elif isinstance(message, ShardUpdate):
            link.shards[message.shard.shard_id] = message.shard
            self._on_change(f"shard {message.shard.shard_id} is {message.shard.state}")
        elif isinstance(message, Reply):
            future = link.pending.pop(message.id, None)
            if future is not None and not future.done():
                future.set_result(message)
        elif came_back:
            self._on_change(f"node {link.name} is back")

    def _clock_sample(self, link: NodeLink, sent_at: float | None) -> None:
        if sent_at is not None:
            link.clock_samples.append(sent_at - self._wall())

    def _detach(self, link: NodeLink, ws: web.WebSocketResponse) -> None:
        if link.ws is ws:
            link.ws = None
            self._fail_pending(link, "the agent disconnected")
            log.info("agent %s disconnected", link.name)
            self._on_change(f"node {link.name} disconnected")

    @staticmethod
    def _fail_pending(link: NodeLink, why: str) -> None:
        for future in link.pending.values():
            if not future.done():
                future.set_exception(AgentError(f"node {link.name}: {why}"))
        link.pending.clear()

    async def close(self) -> None:
        self.closing = True
        for link in list(self.nodes.values()):
            self._fail_pending(link, "the controller is stopping")
            if link.ws is not None:
                with contextlib.suppress(Exception):
                    await link.ws.close()
        await self.background.close()

    # ---------------------------------------------------------------------------------- liveness

    def expire(self) -> list[tuple[str, NodeState]]:
        """Move silent nodes to Unreachable, then Lost; returns the (node, new state) changes."""
        now = self._clock()
        timings = self._timings()
        changes: list[tuple[str, NodeState]] = []
        for link in self.nodes.values():
            silent = now - link.last_seen
            state: NodeState = "Ready"
            if silent >= timings.lost_after_s:
                state = "Lost"
            elif silent >= timings.unreachable_after_s:
                state = "Unreachable"
            if state != link.state:
                link.state = state
                changes.append((link.name, state))
        self._prune(now, timings)
        for name, state in changes:
            log.warning(
                "node %s is %s (no heartbeat for %s)", name, state, "long" if state == "Lost" else "a while"
            )
            self._on_change(f"node {name} is {state}")
        return changes

    def _prune(self, now: float, timings: HubTimings) -> None:
        """Forget undeclared nodes silent for twice the lost time: the reconciler gave their replicas up at
        Lost, and a name an agent once said must not stay in memory (and the admin API) for ever."""
        declared = self._declared()
        for name, link in list(self.nodes.items()):
            if (
                name not in declared
                and not link.connected
                and link.state == "Lost"
                and now - link.last_seen >= 2 * timings.lost_after_s
            ):
                del self.nodes[name]
                log.info("forgot node %s: undeclared and silent since long", name)
                self._on_change(f"node {name} forgotten")

    # ---------------------------------------------------------------------------------- commands

    async def command(self, node: str, command: Command, wait_s: float) -> Reply:
        link = self.nodes.get(node)
        if link is None or link.ws is None or link.ws.closed:
            raise AgentError(f"node {node} is not connected")
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        link.pending[command.id] = future
        try:
            await link.ws.send_str(dump(command))
            async with asyncio.timeout(
                wait_s
            ):  # not wait_for: on 3.11 it can swallow a cancel racing the reply
                return await future
        except TimeoutError as exc:
            raise AgentError(f"node {node} did not answer {command.action} within {wait_s:.0f}s") from exc
        except (ConnectionError, RuntimeError) as exc:
            raise AgentError(f"node {node}: sending {command.action} failed: {exc}") from exc
        finally:
            link.pending.pop(command.id, None)

    async def start_shard(self, node: str, spec: ShardSpec, wait_s: float) -> Reply:
        return await self._checked(node, Command(id=_cid(), action="start_shard", spec=spec), wait_s)

    async def stop_shard(self, node: str, replica_id: str, rank: int, wait_s: float) -> Reply:
        cmd = Command(id=_cid(), action="stop_shard", replica_id=replica_id, shard_rank=rank)
        return await self._checked(node, cmd, wait_s)

    async def _checked(self, node: str, command: Command, wait_s: float) -> Reply:
        reply = await self.command(node, command, wait_s)
        if not reply.ok:
            raise AgentError(f"node {node} refused {command.action}: {reply.error or 'no reason given'}")
        return reply


def _cid() -> str:
    return uuid.uuid4().hex[:12]
