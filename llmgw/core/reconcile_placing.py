"""The reconciler's placing step (reconcile.py's last): the models' replicas to start, placed highest capacity class
first, a model that still does not fit making room by preempting lower classes; and the working notes of one model
in one pass that every step of reconcile writes (`ModelPass`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llmgw.core.fleet.views import ModelState, ModelView, ReplicaView
from llmgw.core.placement import (
    Placement,
    Placer,
    Preemption,
    ShardPlacement,
    commit_preemption,
    find_preemption,
)
from llmgw.core.placement.quota import within_guarantee
from llmgw.core.reconcile_actions import Action, Mode, StartReplica, StopReplica, Wait

__all__ = ["ModelPass", "place_all"]


@dataclass(slots=True)
class ModelPass:
    """The working notes of one model in one pass."""

    name: str
    entry: ModelView
    state: ModelState
    alive: list[ReplicaView] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    # One per replica to place, in order: (reason, id of the replica it replaces or None).
    start_reasons: list[tuple[str, str | None]] = field(default_factory=list)
    wakes: list[float] = field(default_factory=list)
    target: int = 0
    leaving: list[ReplicaView] = field(default_factory=list)  # on nodes removed from the repo or drained
    rolling: list[ReplicaView] = field(default_factory=list)  # alive replicas to be replaced (stale, asked)


def place_all(
    passes: Sequence[ModelPass], placer: Placer, replicas: Sequence[ReplicaView], mode: Mode
) -> dict[str, int]:
    """Models within their owner's guarantee first, then the rest; each highest capacity class first; within a
    class, round-robin over models, one replica each per round,
    every placement taken out of the rooms. What a class cannot place preempts lower classes (`_preempt`).
    Returns the replicas that could not be placed (nor made room for), per model."""
    unplaced: dict[str, int] = {}
    spoken_for: set[str] = set()
    # Models whose owner is still within its guarantee go first, whatever their class: the room a take-back
    # frees (or a yielding replica leaves) is theirs, not the borrower's replacement's.
    phase = {mp.name: (0 if _within_guarantee(mp, placer) else 1, mp.entry.rank) for mp in passes}
    for step in sorted(set(phase.values())):
        queue = {mp.name: mp for mp in passes if mp.start_reasons and phase[mp.name] == step}
        progress = {name: 0 for name in queue}
        while queue:
            for name in list(queue):
                mp = queue[name]
                i = progress[name]
                placement = placer.place_one(name)
                if placement is None:
                    missing = len(mp.start_reasons) - i
                    missing -= _preempt(mp, missing, placer, replicas, spoken_for, mode)
                    if missing:
                        reason = (
                            f"{missing} replica{'s' * (missing != 1)} cannot be placed: no node fits any "
                            f"profile (llmgw explain {name})"
                        )
                        mp.actions.append(Wait(name, None, reason))
                        unplaced[name] = missing
                    del queue[name]
                    continue
                reason, replaces = mp.start_reasons[i]
                mp.actions.append(StartReplica(placement, reason, replaces))
                progress[name] = i + 1
                if progress[name] == len(mp.start_reasons):
                    del queue[name]
    return unplaced


def _within_guarantee(mp: ModelPass, placer: Placer) -> bool:
    profiles = mp.entry.spec.profiles
    return bool(profiles) and within_guarantee(mp.entry, profiles[0], placer.quota) is not None


def _preempt(
    mp: ModelPass,
    missing: int,
    placer: Placer,
    replicas: Sequence[ReplicaView],
    spoken_for: set[str],
    mode: Mode,
) -> int:
    """Make room for up to `missing` replicas of `mp`'s model by stopping replicas of lower classes; the
    room is held for it for the rest of the pass and it is placed once they are gone (a plan shows that
    start now, in the room they leave). Returns how many replicas it made (or is making) room for."""
    made = 0
    by_id = {r.id: r for r in replicas}
    while made < missing:
        found = find_preemption(placer, mp.name, replicas, frozenset(spoken_for))
        if found is None:
            break
        preemption, room = found
        commit_preemption(placer, preemption, room)
        spoken_for.update(preemption.victims, preemption.yielding)
        words = preemption.words(placer.models, by_id)
        for victim in preemption.victims:
            reason = f"preempted: {words} ({mp.name} cannot be placed otherwise)"
            mp.actions.append(StopReplica(victim, reason, drain=True, preempted_by=mp.name))
        waiting = ", ".join(preemption.victims + preemption.yielding)
        if mode == "plan":
            mp.actions.append(_start_in_made_room(mp, placer, preemption, waiting))
        else:
            mp.actions.append(
                Wait(mp.name, None, f"room on {preemption.node} is made: waiting for {waiting} to stop")
            )
        made += 1
    return made


def _start_in_made_room(mp: ModelPass, placer: Placer, preemption: Preemption, waiting: str) -> StartReplica:
    """What a plan shows for a replica placed in the room its victims leave."""
    placement = Placement(
        replica_id=placer.new_id(mp.name, preemption.profile),
        model=mp.name,
        profile=preemption.profile,
        fingerprint=mp.entry.fingerprints.get(preemption.profile, ""),
        shards=(ShardPlacement(preemption.node, 0, preemption.gpus),),
        why=f"preemption: in the room {waiting} leave{'s' * (waiting.count(',') == 0)} on {preemption.node}",
    )
    return StartReplica(placement, f"scale to min {mp.entry.spec.scaling.min} once {waiting} stopped")
