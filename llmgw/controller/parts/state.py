"""The controller's live records: one per replica, one per model, one per node.

Plain dataclasses, no I/O: the revision pipeline (core.py), the reconcile loop, the node loop and the admin
views read and write these, and nothing else keeps a parallel map of the same facts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from llmgw.core.fleet.autoscale import LOAD_TIMES_KEPT, Demand, ScaleDecision, ScaleState, merge_demand
from llmgw.core.fleet.views import ModelState
from llmgw.core.placement import ShardPlacement
from llmgw.store.records import FacilityHold, ReplicaRecord

BootstrapState = Literal["pending", "running", "done", "failed"]
RemovalState = Literal["draining", "removing", "done", "failed"]
BOOTSTRAP_STATES: tuple[BootstrapState, ...] = ("pending", "running", "done", "failed")


@dataclass(frozen=True)
class SeenRevision:
    revision: str
    where: str
    at: float


@dataclass(frozen=True)
class RefusedRevision:
    revision: str
    where: str
    at: float
    errors: tuple[str, ...]


@dataclass
class ReplicaRec:
    """One replica the controller started or adopted. Shard states are read from the hub, not kept here."""

    id: str
    model: str
    profile: str
    fingerprint: str
    created_at: float
    shards: tuple[ShardPlacement, ...]
    adopted: bool = False
    stopping: bool = False
    draining: bool = False
    stale: bool = False
    error: str = ""
    start_sent_at: float = 0.0
    ready_since: float | None = None
    restart: bool = False  # an operator asked for a restart (`llmgw restart`): rolled, then replaced
    replaces: str | None = None  # the replica this one was started to take the place of
    preempted_by: str | None = None  # the model it yields to, while it drains for the preemption grace

    @property
    def node(self) -> str:
        """The node of rank 0 (where the endpoint is)."""
        return next((s.node for s in self.shards if s.rank == 0), self.shards[0].node if self.shards else "")

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(g for s in self.shards for g in s.gpus)


@dataclass
class ModelRecord:
    """What the controller knows of one model between reconcile passes.

    `demand_at`/`used_at` come from the routers (wall time); the rest is what the last pass decided."""

    demand_at: float | None = None  # the last router demand (an on-demand model asked for)
    used_at: float | None = None  # the last use through a router
    wait: str | None = None  # why nothing is done for it now
    backoff: ModelState | None = None  # failures and when the next attempt may start
    unplaceable: dict[str, str] | None = None  # node (or "*") -> why no replica fits there
    target: int | None = None  # the replica count the last pass aimed at
    scale: ScaleState | None = None  # the autoscaler's state, carried between passes
    scaled: ScaleDecision | None = None  # the autoscaler's last decision (status shows it and its inputs)
    # The pace an operator gave `llmgw restart` (max_surge, max_unavailable); kept while the roll runs.
    pace: tuple[int, int] | None = None
    rolling: bool = False  # the last pass had replicas of it to roll
    # Start-to-ready seconds of the replicas this controller started, newest last (a few: what routers are
    # told to hold requests for), and what `llmgw bench --save` measured (None: not measured).
    load_times: tuple[float, ...] = ()
    bench_load_s: float | None = None

    def loaded(self, seconds: float) -> None:
        self.load_times = (*self.load_times, seconds)[-LOAD_TIMES_KEPT:]

    def clear_pass(self) -> None:
        """Forget what the last pass decided (the next one decides it again)."""
        self.wait, self.backoff, self.unplaceable, self.target = None, None, None, None


@dataclass(frozen=True)
class EngineReading:
    """A replica's engine metrics as one router last scraped them; None: not scraped or not published."""

    running: float | None
    waiting: float | None
    kv_usage: float | None
    scrape_error: str | None


@dataclass(frozen=True)
class ReplicaLoad:
    """One router's word on one replica: requests in flight, its last request (wall; None: none seen), and
    whether the router still routes to it (False: dropped from its table, only requests in flight left)."""

    inflight: int
    last_request_at: float | None
    routed: bool
    requests: int = 0  # attempts sent to it since the router started (llmgw_router.fleet.load)
    errors: int = 0  # of those, 5xx or unreachable
    ttft_p99_ms: float | None = None  # over the router's window; None: unknown
    engine: EngineReading | None = None  # None: the router sent none (it does not route there, or is older)


@dataclass(frozen=True)
class RouterLoad:
    """One router's last load report (llmgw_router.fleet.load), as received at `at` (controller wall time)."""

    at: float
    models: dict[str, Demand]
    replicas: dict[str, ReplicaLoad]


@dataclass
class NodeOps:
    """What the controller is doing to one node over SSH, in words an operator can act on."""

    node: str
    state: BootstrapState = "pending"
    step: str = ""  # the last bootstrap step reported
    message: str = ""
    attempts: int = 0
    failures: int = 0  # consecutive failed attempts (the backoff's input)
    retry_at: float | None = None  # monotonic: no new attempt before this
    removal: RemovalState | None = None
    removal_message: str = ""
    drain_started: float | None = None  # monotonic
    forced: bool = False  # its replicas were stopped without waiting any longer for their replacements
    upgrading: bool = False  # `llmgw upgrade` is working on its agent: no bootstrap attempt meanwhile

    def bootstrap_json(self, now: float) -> dict[str, Any]:
        retry = None if self.retry_at is None or self.state != "failed" else max(0.0, self.retry_at - now)
        return {
            "state": self.state,
            "step": self.step,
            "message": self.message,
            "attempts": self.attempts,
            "retry_in_s": None if retry is None else round(retry, 1),
        }

    def removal_json(self) -> dict[str, Any] | None:
        return None if self.removal is None else {"state": self.removal, "message": self.removal_message}


@dataclass
class ControllerNode:
    """The controller's own facts about one node. What its agent says while linked is the hub's `NodeLink`
    (the agent wire's record, which the hub replaces on every reconnect and the fake agents own in tests)."""

    name: str
    ops: NodeOps | None = None  # the SSH work on it: remote Nodes only
    stored_state: str | None = None  # the state last written to the store (Ready, Unreachable, Lost)


@dataclass
class NodeBook:
    """The controller's own facts about its nodes, one `ControllerNode` each (made on first use), and the lock
    that lets one agent upgrade run at a time (llmgw.controller.api.upgrades)."""

    records: dict[str, ControllerNode] = field(default_factory=dict)
    upgrade_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def node(self, name: str) -> ControllerNode:
        """Node `name`'s record, made on first use."""
        rec = self.records.get(name)
        if rec is None:
            rec = self.records[name] = ControllerNode(name)
        return rec

    def ops(self, name: str) -> NodeOps | None:
        """The SSH work on node `name`, if any was begun."""
        rec = self.records.get(name)
        return rec.ops if rec is not None else None

    def ops_for(self, name: str) -> NodeOps:
        """The SSH work on node `name`, begun now if it was not."""
        rec = self.node(name)
        if rec.ops is None:
            rec.ops = NodeOps(name)
        return rec.ops

    def all_ops(self) -> dict[str, NodeOps]:
        return {n: r.ops for n, r in self.records.items() if r.ops is not None}

    def set_stored(self, states: dict[str, str]) -> None:
        """What the store holds of the nodes (read at start or on taking over): the states last written."""
        for rec in self.records.values():
            rec.stored_state = None
        for name, state in states.items():
            self.node(name).stored_state = state


@dataclass
class WorkerState:
    """What the reconcile worker carries between passes (touched only by it and the demand endpoints)."""

    models: dict[str, ModelRecord] = field(default_factory=dict)
    passes: int = 0
    last_pass_at: float | None = None
    last_actions: list[str] = field(default_factory=list)
    # replica id -> (state, restart asked) last written
    stored_states: dict[str, tuple[str, bool]] = field(default_factory=dict)
    known_records: dict[str, ReplicaRecord] = field(default_factory=dict)  # from the store at start
    # What the last leader left (replicas, canary runs, owed statuses) has been read, or could not be: the
    # canary loop waits for it, so a run is resumed rather than begun a second time.
    earlier_state_read: bool = False
    # Nodes that were up before this controller started: no replica is started until they are back (or the
    # settle window ends), so their running replicas are adopted instead of being placed a second time.
    expected_nodes: set[str] = field(default_factory=set)
    settle_until: float = 0.0
    loads: dict[str, RouterLoad] = field(default_factory=dict)  # router connection -> its last load report
    # Nodes an operator drained (`llmgw node drain`): node -> who and when, in words. Cordoned until
    # uncordoned; kept in the store too (node_drains), read back at start and on taking over.
    drained: dict[str, str] = field(default_factory=dict)
    # Facility domains an operator held (`llmgw facility hold rack=r1`): nothing new is placed on their nodes;
    # with `drain`, their replicas move elsewhere too. Kept in the store (facility_holds) like drains.
    holds: dict[str, FacilityHold] = field(default_factory=dict)

    def model(self, name: str) -> ModelRecord:
        """Model `name`'s record, made on first use."""
        rec = self.models.get(name)
        if rec is None:
            rec = self.models[name] = ModelRecord()
        return rec

    def backoff(self) -> dict[str, ModelState]:
        return {m: r.backoff for m, r in self.models.items() if r.backoff is not None}

    def demand(self) -> dict[str, float]:
        return {m: r.demand_at for m, r in self.models.items() if r.demand_at is not None}

    def model_demand(self) -> dict[str, Demand]:
        """Each model's load summed over the routers connected now."""
        by_model: dict[str, list[Demand]] = {}
        for report in self.loads.values():
            for name, demand in report.models.items():
                by_model.setdefault(name, []).append(demand)
        return {m: d for m, reports in by_model.items() if (d := merge_demand(reports)) is not None}

    def replica_idleness(self) -> dict[str, tuple[int, float | None]]:
        """Per replica: requests in flight over every router, and its latest request any of them saw."""
        out: dict[str, tuple[int, float | None]] = {}
        for report in self.loads.values():
            for rid, seen in report.replicas.items():
                inflight, last = out.get(rid, (0, None))
                stamps = [t for t in (last, seen.last_request_at) if t is not None]
                out[rid] = (inflight + seen.inflight, max(stamps) if stamps else None)
        return out

    def replica_drained(self, replica_id: str, since: float) -> bool | None:
        """Whether no router can send `replica_id` a request any more and none has one in flight: every
        router's last report came after `since` and neither routes to it nor has it busy. None: no router
        reports load (unknown: the caller waits its full drain time)."""
        if not self.loads:
            return None
        for report in self.loads.values():
            if report.at <= since:
                return False
            seen = report.replicas.get(replica_id)
            if seen is not None and (seen.routed or seen.inflight > 0):
                return False
        return True

    def last_used(self) -> dict[str, float]:
        """The later of a model's last use and last demand (what scale-to-zero counts idle time from)."""
        out: dict[str, float] = {}
        for m, r in self.models.items():
            if r.used_at is not None or r.demand_at is not None:
                out[m] = max(r.used_at or 0.0, r.demand_at or 0.0)
        return out


@dataclass
class EventLog:
    """Recent events in memory (the store keeps them too); newest last."""

    items: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=500))
