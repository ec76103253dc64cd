"""Preemption: when a model of a higher capacity class cannot be placed, which replicas of lower classes
yield their room. Pure: a placement pass's rooms and the live replicas in, a choice out.

Rules (docs/controller.md, Capacity classes and preemption):
- only replicas of strictly lower classes are candidates: never one of the same or a higher class;
- replicas already on their way out (draining, stopping) are counted as room first, so a preemption that
  waits for its victims to stop does not pick more victims on the next pass;
- on one node, the fewest victims that make room, then those of the lowest classes, then the least
  freed; a choice is never larger than it needs to be: no victim in it could be spared and still leave room;
- only single-node profiles preempt (a multi-node replica needs a whole fabric: freeing one is a plan of its
  own, not a side effect);
- the caller asks once per missing replica of the higher model, so nothing is freed beyond its need.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from llmgw.core.config.models import Profile
from llmgw.core.fleet.views import GIB, ModelView, ReplicaView
from llmgw.core.placement.place import Placer
from llmgw.core.placement.quota import quota_refusal
from llmgw.core.placement.rooms import DiskPool, Room, fit_check, gpus_needed, static_fits

__all__ = ["Preemption", "commit_preemption", "find_preemption"]

EXHAUSTIVE_MAX = 10  # candidates on one node searched over every subset; beyond, greedy then pruned
_ALIVE = frozenset({"pending", "starting", "ready", "failed"})
_YIELDING = frozenset({"draining", "stopping"})


@dataclass(frozen=True, slots=True)
class Preemption:
    """Room for one replica of `model` on `node`: `victims` are drained and stopped now, `yielding` are
    already going; the replica is placed once they are gone."""

    model: str
    profile: str
    node: str
    victims: tuple[str, ...]
    yielding: tuple[str, ...]
    gpus: tuple[int, ...] = ()  # the devices the replica will take there once they are free

    def words(self, models: Mapping[str, ModelView], replicas: Mapping[str, ReplicaView]) -> str:
        who = ", ".join(_who(models, replicas[v]) for v in self.victims) or "nothing new"
        return f"{who} yield{'s' * (len(self.victims) == 1)} {self.node} to {_who_model(models, self.model)}"


def _who_model(models: Mapping[str, ModelView], model: str) -> str:
    view = models.get(model)
    return f"{model} ({view.class_name if view else '?'})"


def _who(models: Mapping[str, ModelView], r: ReplicaView) -> str:
    return f"{r.id} of {_who_model(models, r.model)}"


def _copy(room: Room) -> Room:
    return replace(
        room,
        free_gpus={cls: list(free) for cls, free in room.free_gpus.items()},
        per_model=dict(room.per_model),
        disk=DiskPool(room.disk.free, None if room.disk.weights is None else set(room.disk.weights)),
    )


def _release(room: Room, replica: ReplicaView, profile: Profile | None) -> None:
    """Give back what `replica`'s shard on this room's node holds (the inverse of Room.take)."""
    classes = {g.index: g.gpu_class for g in room.node.gpus or ()}
    for shard in replica.shards:
        if shard.node != room.name:
            continue
        for index in shard.gpus:
            free = room.free_gpus.setdefault(classes.get(index), [])
            if index not in free:
                free.append(index)
                free.sort()
        if profile is not None and profile.cpu_cores is not None:
            room.cpu_reserved -= profile.cpu_cores
            if room.cpu_free is not None:
                room.cpu_free += profile.cpu_cores
        if profile is not None and profile.min_memory_gb is not None:
            need = int(profile.min_memory_gb * GIB)
            room.mem_reserved -= need
            if room.mem_free is not None:
                room.mem_free += need
        room.per_model[replica.model] = max(0, room.per_model.get(replica.model, 0) - 1)


def _profile_of(models: Mapping[str, ModelView], r: ReplicaView) -> Profile | None:
    view = models.get(r.model)
    if view is None:
        return None
    return next((p for p in view.spec.profiles if p.name == r.profile), None)


def _size(models: Mapping[str, ModelView], r: ReplicaView) -> tuple[int, int]:
    profile = _profile_of(models, r)
    gpus = sum(len(s.gpus) for s in r.shards)
    return gpus, (profile.cpu_cores or 0) if profile is not None else 0


@dataclass(frozen=True, slots=True)
class _Choice:
    key: tuple[object, ...]
    room: Room
    victims: tuple[ReplicaView, ...]
    yielding: tuple[ReplicaView, ...]
    profile: Profile


def _fits_without(
    base: Room,
    gone: Sequence[ReplicaView],
    models: Mapping[str, ModelView],
    profile: Profile,
    wkey: str | None,
) -> Room | None:
    room = _copy(base)
    for r in gone:
        _release(room, r, _profile_of(models, r))
    return room if fit_check(profile, wkey)(room) else None


def _smallest(
    base: Room,
    yielding: Sequence[ReplicaView],
    candidates: Sequence[ReplicaView],
    models: Mapping[str, ModelView],
    profile: Profile,
    wkey: str | None,
) -> tuple[Room, tuple[ReplicaView, ...]] | None:
    """The fewest candidates whose room (with the yielding ones') fits the profile; lowest classes first."""
    order = sorted(candidates, key=lambda r: (-models[r.model].rank, _size(models, r), -r.created_at, r.id))
    if len(order) <= EXHAUSTIVE_MAX:
        for size in range(0, len(order) + 1):
            for combo in itertools.combinations(order, size):
                room = _fits_without(base, (*yielding, *combo), models, profile, wkey)
                if room is not None:
                    return room, combo
        return None
    chosen: list[ReplicaView] = []
    for r in order:
        chosen.append(r)
        if _fits_without(base, (*yielding, *chosen), models, profile, wkey) is not None:
            break
    else:
        return None
    for r in list(reversed(chosen)):  # prune: drop any victim the room can be made without
        rest = [x for x in chosen if x is not r]
        if _fits_without(base, (*yielding, *rest), models, profile, wkey) is not None:
            chosen = rest
    room = _fits_without(base, (*yielding, *chosen), models, profile, wkey)
    return None if room is None else (room, tuple(chosen))


def find_preemption(
    placer: Placer, model: str, replicas: Sequence[ReplicaView], spoken_for: frozenset[str]
) -> tuple[Preemption, Room] | None:
    """Where one replica of `model` could go once lower-class replicas yield, and the room as it will be
    (with that replica taken out of it). `spoken_for`: replica ids already yielding to someone this pass.
    None when nothing of a lower class can make room (or the model has no lower class below it)."""
    models = placer.models
    entry = models.get(model)
    if entry is None:
        return None
    wkey = entry.weights_key
    best: _Choice | None = None
    for profile in entry.spec.profiles:
        if profile.nodes > 1 or quota_refusal(entry, profile, placer.quota) is not None:
            continue
        for room in placer.rooms.values():
            if not static_fits(room.node, profile):
                continue
            here = [
                r for r in replicas if r.id not in spoken_for and any(s.node == room.name for s in r.shards)
            ]
            yielding = [r for r in here if r.state in _YIELDING]
            candidates = [
                r
                for r in here
                if r.state in _ALIVE and r.model in models and models[r.model].rank > entry.rank
            ]
            if not candidates and not yielding:
                continue
            found = _smallest(room, yielding, candidates, models, profile, wkey)
            if found is None:
                continue
            made, victims = found
            key = (
                len(victims),
                tuple(sorted(-models[v.model].rank for v in victims)),
                tuple(sum(x) for x in zip(*(_size(models, v) for v in victims), strict=True)),
                room.name,
            )
            if best is None or key < best.key:
                best = _Choice(key, made, victims, tuple(yielding), profile)
        if best is not None:
            break  # the model's preference order: a preferred profile that can be made room for wins
    if best is None:
        return None
    room = best.room
    need = gpus_needed(best.profile)
    gpus = tuple(room.free_gpus.get(best.profile.gpu_class, [])[:need]) if best.profile.gpu_class else ()
    room.take(model, best.profile, gpus, wkey)
    preemption = Preemption(
        model,
        best.profile.name,
        room.name,
        tuple(v.id for v in best.victims),
        tuple(y.id for y in best.yielding),
        gpus,
    )
    return preemption, room


def commit_preemption(placer: Placer, preemption: Preemption, room: Room) -> None:
    """Hold the room `find_preemption` made for its model for the rest of the pass (and count the replica's
    GPUs against the model's quotas), so no other placement in the pass takes what the victims free."""
    placer.replace_room(room)
    entry = placer.models[preemption.model]
    profile = next(p for p in entry.spec.profiles if p.name == preemption.profile)
    if profile.gpu_class is not None and gpus_needed(profile):
        placer.quota.add(entry, profile.gpu_class, gpus_needed(profile))
