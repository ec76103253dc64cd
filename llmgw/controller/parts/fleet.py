"""The live fleet records, one part of the Controller: what it knows of the fleet now, apart from the revision
pipeline, the credentials and the wire. A function that reads only these takes this part, not the Controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.controller.parts.canary_record import CanaryBook
from llmgw.controller.parts.check_book import CheckBook
from llmgw.controller.parts.state import EventLog, NodeBook, ReplicaRec, WorkerState
from llmgw.core.fleet.autoscale import Capacity

__all__ = ["LiveFleet"]


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
