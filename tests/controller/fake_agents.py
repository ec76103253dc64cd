"""A fake `AgentClient`: the agents' side of the reconcile loop without sockets or processes.

It keeps `NodeLink`s exactly as `AgentHub` does (one per node, the shards by `<replica>-<rank>`), runs
`on_register` at registration as the hub does, and answers `start_shard`/`stop_shard` the way an agent
does: a shard it starts reports `starting` (then whatever the test says), a stop removes it, a node that is
not connected or told to refuse raises `AgentError`. Every command is recorded for the test to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmgw_agent.protocol import (
    Command,
    EngineInstall,
    Gpu,
    Inventory,
    Register,
    Reply,
    ShardSpec,
    ShardState,
    ShardStatus,
)
from support import write_bindings

from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.hub import AgentError, NodeLink
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.store.store import Store

from .helpers import settings_for


class _OpenSocket:
    """Stands for a link's WebSocket: open until closed (NodeLink.connected reads `closed`)."""

    closed = False

    async def close(self) -> None:
        self.closed = True


@dataclass
class Sent:
    node: str
    action: str  # start_shard | stop_shard
    replica_id: str
    rank: int
    spec: ShardSpec | None = None


@dataclass
class FakeAgents:
    """`clock` is the controller's monotonic clock; `on_change` is what the hub calls (controller.notify)."""

    clock: Callable[[], float] = lambda: 0.0
    on_change: Callable[[str], None] = lambda why: None
    nodes: dict[str, NodeLink] = field(default_factory=dict)
    on_register: Callable[[NodeLink, Register], None] | None = None
    sent: list[Sent] = field(default_factory=list)
    refuse_start: dict[str, str] = field(default_factory=dict)  # node -> the agent's refusal of start_shard
    commands: list[tuple[str, Command]] = field(default_factory=list)  # other commands, as sent
    # Set by a test to hold the agents' answers to start_shard until it is set (a slow agent); None answers now.
    start_answered: asyncio.Event | None = None

    # ------------------------------------------------------------------ the agents' side, driven by a test

    def register(
        self,
        node: str,
        *,
        cpu_cores: int = 8,
        shards: list[ShardStatus] | None = None,
        gpus: list[Gpu] | None = None,
        engines: dict[str, EngineInstall] | None = None,
    ) -> NodeLink:
        """An agent connects and registers, reporting `shards` already running there (and `gpus`, `engines`
        when given: none, and whatever placement takes for unknown, otherwise)."""
        register = Register(
            node=node,
            agent_version="fake",
            inventory=Inventory(cpu_cores=cpu_cores, memory_bytes=64 << 30, gpus=gpus or [], engines=engines),
            shards=shards or [],
        )
        now = self.clock()
        link = NodeLink(
            name=node,
            inventory=register.inventory,
            agent_version=register.agent_version,
            address="fake",
            connected_at=now,
            last_seen=now,
            shards={s.shard_id: s for s in register.shards},
            ws=_OpenSocket(),  # type: ignore[arg-type]
            registered_shards=tuple(s.shard_id for s in register.shards),
        )
        self.nodes[node] = link
        if self.on_register is not None:
            self.on_register(link, register)
        self.on_change(f"node {node} registered")
        return link

    def disconnect(self, node: str) -> None:
        self.nodes[node].ws = None
        self.on_change(f"node {node} disconnected")

    def report(self, node: str, replica_id: str, state: ShardState, rank: int = 0) -> None:
        """The agent says a shard it runs is now `state` (a ShardUpdate)."""
        link = self.nodes[node]
        shard = link.shards[f"{replica_id}-{rank}"]
        link.shards[shard.shard_id] = shard.model_copy(update={"state": state})
        self.on_change(f"shard {shard.shard_id} is {state}")

    def started(self, node: str | None = None) -> list[Sent]:
        return [s for s in self.sent if s.action == "start_shard" and node in (None, s.node)]

    def stopped(self) -> list[Sent]:
        return [s for s in self.sent if s.action == "stop_shard"]

    # ------------------------------------------------------------------ AgentClient

    def _link(self, node: str, action: str) -> NodeLink:
        link = self.nodes.get(node)
        if link is None or not link.connected:
            raise AgentError(f"node {node} is not connected")
        return link

    async def start_shard(self, node: str, spec: ShardSpec, wait_s: float) -> Reply:
        link = self._link(node, "start_shard")
        self.sent.append(Sent(node, "start_shard", spec.replica_id, spec.shard_rank, spec))
        refusal = self.refuse_start.get(node)
        if refusal is not None:
            raise AgentError(f"node {node} refused start_shard: {refusal}")
        status = ShardStatus(
            replica_id=spec.replica_id,
            shard_rank=spec.shard_rank,
            model=spec.model,
            engine=spec.engine,
            state="starting",
            pid=4242,
            host="127.0.0.1",
            port=9000 + len(self.sent),
            fingerprint=spec.fingerprint,
            gpus=list(spec.gpus),
        )
        if self.start_answered is not None:
            await self.start_answered.wait()
        link.shards[status.shard_id] = status
        self.on_change(f"shard {status.shard_id} is starting")
        return Reply(id=f"fake-{len(self.sent)}", ok=True)

    async def command(self, node: str, command: Command, wait_s: float) -> Reply:
        self._link(node, command.action)
        self.sent.append(Sent(node, command.action, "", 0))
        self.commands.append((node, command))
        return Reply(id=command.id, ok=True)

    async def stop_shard(self, node: str, replica_id: str, rank: int, wait_s: float) -> Reply:
        link = self._link(node, "stop_shard")
        self.sent.append(Sent(node, "stop_shard", replica_id, rank))
        link.shards.pop(f"{replica_id}-{rank}", None)
        return Reply(id=f"fake-{len(self.sent)}", ok=True)


@contextlib.asynccontextmanager
async def reconciling(
    tmp: Path, repo: Path, secrets: dict[str, str], bindings: list[str]
) -> AsyncIterator[tuple[Controller, FakeAgents, Reconciler]]:
    """A real controller (its store, the repo at `repo`) reconciling against FakeAgents, with `secrets` written
    to its secrets directory and `bindings` as its binding map (llmgw.core.config.secret_bindings)."""
    settings = settings_for(tmp, repo)
    for name, value in secrets.items():
        (tmp / "secrets").mkdir(exist_ok=True)
        (tmp / "secrets" / name).write_text(value + "\n")
    write_bindings(tmp / "secrets", bindings)
    store = await Store.open(settings.store)
    agents = FakeAgents(clock=time.monotonic)
    c = Controller(settings, store, ControllerMetrics(), admin_token="admin", agents=agents)
    agents.on_change = c.notify
    reconciler = Reconciler(c)
    agents.on_register = reconciler.adopt
    try:
        yield c, agents, reconciler
    finally:
        await reconciler.close()
        await c.stop_background()
        await store.close()
