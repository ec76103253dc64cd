"""The reconciler's vocabulary, as values: the actions a pass returns, the policies it is given (backoff, roll
pace, a canary's phase) and the decision it comes back with. Pure; `llmgw.core.reconcile` is the face that exports
them with the pass itself."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from llmgw.core.fleet.views import ModelState
from llmgw.core.placement import Placement, ShardPlacement

__all__ = [
    "Action",
    "BackoffPolicy",
    "CanaryPhase",
    "MarkStale",
    "Mode",
    "ReconcileDecision",
    "RestartReplica",
    "RollPace",
    "StartReplica",
    "StopReplica",
    "Wait",
]


Mode = Literal["run", "plan"]


@dataclass(frozen=True, slots=True)
class StartReplica:
    placement: Placement
    reason: str
    replaces: str | None = None  # the failed, lost or stale replica this one takes the place of

    @property
    def shards_in_start_order(self) -> tuple[ShardPlacement, ...]:
        """Workers before rank 0."""
        return self.placement.start_order()


@dataclass(frozen=True, slots=True)
class StopReplica:
    replica_id: str
    reason: str
    drain: bool  # let in-flight requests finish first (scale-down, removed model); False for failed ones
    # The replica's node is Lost: nothing can be told to it, drop the record (the agent, if it returns,
    # reports a replica nobody knows and it is stopped as an orphan then).
    forget: bool = False
    # The model it yields to (preemption): its drain is the Cluster's preemption_grace, not a scale-down's.
    preempted_by: str | None = None


@dataclass(frozen=True, slots=True)
class MarkStale:
    replica_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RestartReplica:
    """Drain and stop a stale replica; its replacement is a StartReplica (this pass or the next)."""

    replica_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    model: str
    until: float | None  # None: until something changes (a node, the catalog)
    reason: str


Action = StartReplica | StopReplica | MarkStale | RestartReplica | Wait
A = TypeVar("A", StartReplica, StopReplica, MarkStale, RestartReplica, Wait)


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Delay before replacing a failed replica: base * factor^(failures-1), capped, jittered by +-jitter."""

    base: float = 5.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.2
    reset_after: float = 600.0  # a replica ready this long forgets the model's failures

    def delay(self, failures: int, rng: random.Random) -> float:
        raw = min(self.cap, self.base * self.factor ** max(0, failures - 1))
        return min(self.cap, raw * (1.0 + self.jitter * (2.0 * rng.random() - 1.0)))


@dataclass(frozen=True, slots=True)
class CanaryPhase:
    """Where a model's canary stands: running (also: none started yet), promoted (the roll goes on), or
    failed (its `replicas`, the canary ones, are stopped; the stable ones stay)."""

    phase: Literal["running", "promoted", "failed"] = "running"
    replicas: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RollPace:
    """How many replicas a roll may start beyond the target, and how many ready ones may be missing."""

    max_surge: int = 1
    max_unavailable: int = 0


@dataclass(frozen=True, slots=True)
class ReconcileDecision:
    actions: tuple[Action, ...]
    backoff: Mapping[str, ModelState]
    wake_at: float | None  # the next time something is due (backoff end, idle deadline); None: nothing
    unplaced: Mapping[str, int] = field(default_factory=dict)  # model -> replicas no node could take
    targets: Mapping[str, int] = field(default_factory=dict)  # model -> replicas it should have now

    def of(self, kind: type[A]) -> list[A]:
        """The actions of one kind, in order."""
        return [a for a in self.actions if isinstance(a, kind)]
