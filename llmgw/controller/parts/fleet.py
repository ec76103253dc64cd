"""The live fleet records, one part of the Controller: what it knows of the fleet now, apart from the revision
pipeline, the credentials and the wire. A function that reads only these takes this part, not the Controller.

A read-only view that needs more than the records takes a FleetReader (or a StatusReader): the parts it reads,
named as protocols the Controller satisfies as it is, so such a view cannot reach the credentials, the store or
the wire. A loop that acts on the fleet takes a FleetActor (an EngineCaller when it calls engines itself). `desired` is read at each call (a new revision replaces the reference): live views, not snapshots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.controller.parts.canary_record import CanaryBook
from llmgw.controller.parts.check_book import CheckBook
from llmgw.controller.parts.desired import Desired
from llmgw.controller.parts.hub import AgentClient
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.parts.settings import ControllerOptions
from llmgw.controller.parts.state import (
    EventLog,
    NodeBook,
    RefusedRevision,
    ReplicaRec,
    SeenRevision,
    WorkerState,
)
from llmgw.core.fleet.autoscale import Capacity
from llmgw.core.fleet.federation import PeerView
from llmgw.store.store import Store

__all__ = ["EngineCaller", "FleetActor", "FleetReader", "LiveFleet", "StatusReader"]


@dataclass
class LiveFleet:
    replicas: dict[str, ReplicaRec] = field(default_factory=dict)
    # (model, profile) -> what `llmgw bench --save` measured one replica to serve (read from the store).
    capacities: dict[tuple[str, str], Capacity] = field(default_factory=dict)
    events: EventLog = field(default_factory=EventLog)
    canaries: CanaryBook = field(default_factory=CanaryBook)  # each canary model's run (loops/canary.py)
    # Model-check verdicts per model and engine version; `auto`: the controller checks new ones itself.
    model_checks: CheckBook = field(default_factory=CheckBook)
    worker_state: WorkerState = field(default_factory=WorkerState)  # what the reconcile worker carries
    nodes: NodeBook = field(default_factory=NodeBook)  # per node: SSH bootstrap and removal, the state stored
    peers: dict[str, PeerView] = field(
        default_factory=dict
    )  # per peer: what its checks found (loops/peers.py)


class FleetReader(Protocol):
    """The applied revision, the live fleet's records, what the agents report, the settings and the clocks."""

    @property
    def desired(self) -> Desired | None: ...

    @property
    def fleet(self) -> LiveFleet: ...

    @property
    def agents(self) -> AgentClient: ...

    @property
    def settings(self) -> ControllerOptions: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def wall(self) -> Callable[[], float]: ...


class StatusReader(FleetReader, Protocol):
    """A FleetReader and where the revision pipeline stands: what `llmgw status` shows above the fleet."""

    @property
    def applied_at(self) -> float | None: ...

    @property
    def seen(self) -> SeenRevision | None: ...

    @property
    def polled(self) -> SeenRevision | None: ...

    @property
    def refused(self) -> RefusedRevision | None: ...

    @property
    def source_error(self) -> str | None: ...

    def sync_status(self) -> str: ...

    def leadership(self) -> dict[str, object]: ...


class FleetActor(FleetReader, Protocol):
    """A FleetReader that acts: writes the store, counts metrics, records events, wakes the reconcile worker
    and the router publisher, and asks whether this controller leads (see llmgw.controller.parts.lease)."""

    @property
    def store(self) -> Store: ...

    @property
    def metrics(self) -> ControllerMetrics: ...

    async def event(self, kind: str, obj: str, message: str) -> None: ...

    def notify(self, why: str = "") -> None: ...

    def leading(self) -> bool: ...


class EngineCaller(FleetActor, Protocol):
    """A FleetActor that calls the engines itself: their keys derive from the cluster secret."""

    def cluster_secret(self) -> str: ...
