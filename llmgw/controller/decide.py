"""One reconcile pass as a pure function: desired + live views in, actions out.

The controller's own until llmgw.reconcile lands; placement itself is llmgw.placement's. No I/O, no clock:
`now` is passed, and new replica ids come from the factory the shell hands in.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.config.models import duration_seconds
from llmgw.controller.desired import Desired
from llmgw.fleet import ModelState, NodeView, ReplicaView
from llmgw.placement import ACTIVE_STATES, IdFactory, Placement, place

DEMAND_KEEP_S = 300.0  # an on-demand model without idle_timeout stays up this long after its last use
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 300.0


@dataclass(frozen=True)
class StartReplica:
    placement: Placement


@dataclass(frozen=True)
class StopReplica:
    replica_id: str
    reason: str
    failed: bool = False  # counts toward the model's backoff


@dataclass(frozen=True)
class ForgetReplica:
    """The replica's node is Lost (or gone): nothing can be told to it; it is dropped and replaced elsewhere."""

    replica_id: str
    reason: str


Action = StartReplica | StopReplica | ForgetReplica


@dataclass(frozen=True)
class Pass:
    actions: tuple[Action, ...]
    wake_in: float | None  # seconds until something becomes due (a backoff ends); None: only on change
    unplaceable: Mapping[str, Mapping[str, str]]  # model -> node (or profile/node) -> why not
    targets: Mapping[str, int]


def next_backoff(previous: ModelState | None, replica_id: str, now: float, rng: random.Random) -> ModelState:
    """Jittered exponential backoff carried on the model, not on the replica that just failed."""
    prev = previous or ModelState()
    if replica_id in prev.counted:
        return prev
    failures = prev.failures + 1
    delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (failures - 1)) * rng.uniform(0.8, 1.2)
    return ModelState(failures, now + delay, prev.counted | {replica_id})


def target_count(
    spec_min: int, spec_max: int, idle_timeout: str | None, recent: float | None, now: float
) -> int:
    """min, or at least one while the model was asked for or used within its idle timeout."""
    target = spec_min
    if recent and spec_max > 0:
        keep = duration_seconds(idle_timeout) if idle_timeout else DEMAND_KEEP_S
        if now - recent < keep:
            target = max(target, 1)
    return min(target, spec_max)


def model_target(
    desired: Desired, name: str, demand: Mapping[str, float], used: Mapping[str, float], now: float
) -> int:
    scaling = desired.models[name].spec.scaling
    recent = max(demand.get(name, 0.0), used.get(name, 0.0)) or None
    return target_count(scaling.min, scaling.max, scaling.idle_timeout, recent, now)


def reconcile(
    desired: Desired,
    nodes: Sequence[NodeView],
    replicas: Sequence[ReplicaView],
    *,
    now: float,
    demand: Mapping[str, float],
    used: Mapping[str, float],
    backoff: Mapping[str, ModelState],
    new_id: IdFactory | None = None,
) -> Pass:
    actions: list[Action] = []
    gone = {n.name for n in nodes if n.state == "Lost"}
    known = {n.name for n in nodes}
    live: list[ReplicaView] = []
    kept: list[ReplicaView] = []
    for r in replicas:
        state = r.effective_state()
        lost = [s.node for s in r.shards if s.node in gone or s.node not in known]
        if lost:
            actions.append(ForgetReplica(r.id, f"node {lost[0]} is lost"))
            continue
        kept.append(r)
        if state in ("stopping", "stopped", "draining"):
            continue
        if r.model not in desired.models:
            actions.append(StopReplica(r.id, "model removed from the cluster repo"))
        elif state == "failed":
            actions.append(StopReplica(r.id, "replica failed", failed=True))
        elif state in ACTIVE_STATES:
            live.append(r)
    wanted: dict[str, int] = {}
    targets: dict[str, int] = {}
    wake: list[float] = []
    for name in sorted(desired.models):
        if not desired.models[name].spec.profiles:
            continue
        mine = [r for r in live if r.model == name]
        want = targets[name] = model_target(desired, name, demand, used, now)
        if len(mine) > want:
            # Not-ready and newest first, so serving replicas are kept.
            order = sorted(mine, key=lambda r: (r.effective_state() == "ready", -r.created_at))
            actions.extend(StopReplica(r.id, f"scale down to {want}") for r in order[: len(mine) - want])
        elif len(mine) < want:
            held = backoff.get(name)
            if held is not None and held.not_before > now:
                wake.append(held.not_before - now)
            else:
                wanted[name] = want - len(mine)
    unplaceable: dict[str, dict[str, str]] = {}
    if wanted:
        result = place(desired.fleet_models, nodes, kept, wanted, new_id)
        actions.extend(StartReplica(p) for p in result.placements)
        for miss in result.unplaced:
            reasons: dict[str, str] = {}
            for profile, by_node in miss.explanation.rejections().items():
                for node, why in by_node.items():
                    reasons.setdefault(node, f"{profile}: {why}")
            if not nodes:
                reasons["*"] = "no node is connected"
            if miss.explanation.problem:
                reasons["*"] = miss.explanation.problem
            unplaceable[miss.model] = reasons
    return Pass(tuple(actions), min(wake) if wake else None, unplaceable, targets)
