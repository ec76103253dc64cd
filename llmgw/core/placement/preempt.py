"""Preemption: when a model of a higher capacity class cannot be placed, which replicas of lower classes
yield their room; and when a model whose owner is within its guarantee cannot be placed, which borrowed
replicas (of other tenants, beyond their own guarantees) are taken back. Pure: a placement pass's rooms and the live replicas in, a choice out.

Rules (docs/controller.md, Capacity classes and preemption):
- only replicas of strictly lower classes are candidates, or, for a model whose owner is within its guarantee,
  replicas of the same class of GPU (or CPU) that other tenants hold beyond their guarantees (borrowed);
- never a replica whose taking would leave a tenant the taker does not share below its guarantee;
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
from dataclasses import dataclass, field, replace

from llmgw.core.config.models import Profile
from llmgw.core.fleet.views import GIB, ModelView, ReplicaView
from llmgw.core.placement.place import Placer
from llmgw.core.placement.quota import (
    Held,
    QuotaUse,
    borrowed,
    guarantee_keeps,
    quota_refusal,
    replica_need,
    shard_need,
    within_guarantee,
)
from llmgw.core.placement.rooms import DiskPool, Room, fit_check, gpus_needed, static_fits

__all__ = ["TAKEN_BACK", "Preemption", "commit_preemption", "find_preemption"]

TAKEN_BACK = "taken back within {scope}'s guarantee"  # in a preempted replica's reason (plan lists them)
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
    # Victims taken back for a tenant within its guarantee: victim id -> why it is borrowed, in words.
    taken_back: Mapping[str, str] = field(default_factory=dict)
    guarantee: str = ""  # the scope within whose guarantee the replica is placed ("Team a")

    def words(self, models: Mapping[str, ModelView], replicas: Mapping[str, ReplicaView]) -> str:
        who = ", ".join(
            _who(models, replicas[v]) + (f" ({self.taken_back[v]})" if v in self.taken_back else "")
            for v in self.victims
        )
        text = f"{who or 'nothing new'} yield{'s' * (len(self.victims) == 1)} {self.node} to "
        text += _who_model(models, self.model)
        if self.taken_back:
            text += ", " + TAKEN_BACK.format(scope=self.guarantee)
        return text


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
    taken_back: Mapping[str, str]


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


def _use_after_yielding(
    placer: Placer, replicas: Sequence[ReplicaView], spoken_for: frozenset[str]
) -> QuotaUse:
    """What each scope will hold once the replicas already on their way out are gone: a guarantee is judged
    on that, or a second victim would be taken from a tenant the first one brought down to its guarantee."""
    use = QuotaUse(dict(placer.quota.by_class))
    for r in replicas:
        if r.id in spoken_for or r.state in _YIELDING:
            view = placer.models.get(r.model)
            found = replica_need(view, r)
            if view is not None and found is not None:
                use.add(view, found[0], Held() - found[1])
    return use


def _may_take(
    placer: Placer, entry: ModelView, profile: Profile, use: QuotaUse, r: ReplicaView
) -> tuple[bool, str]:
    """Whether `r` may yield to a replica of `entry`'s `profile`, and the take-back words when it yields
    because the taker is within its guarantee (a lower class yields without words)."""
    models = placer.models
    view = models[r.model]
    found = replica_need(view, r)
    if found is not None and guarantee_keeps(view, found[0], found[1], use, entry) is not None:
        return False, ""
    if view.rank > entry.rank:
        return True, ""
    scope = within_guarantee(entry, profile, use)
    if scope is None or found is None or found[0] != shard_need(profile, 0)[0]:
        return False, ""
    words = borrowed(view, found[0], use, scope)
    return words is not None, words or ""


def find_preemption(
    placer: Placer, model: str, replicas: Sequence[ReplicaView], spoken_for: frozenset[str]
) -> tuple[Preemption, Room] | None:
    """Where one replica of `model` could go once replicas of lower classes, or borrowed ones when it is within
    its owner's guarantee, yield; and the room as it will be (with that replica taken out of it).
    `spoken_for`: replica ids already yielding to someone this pass. None when nothing can make room."""
    models = placer.models
    entry = models.get(model)
    if entry is None:
        return None
    wkey = entry.weights_key
    use = _use_after_yielding(placer, replicas, spoken_for)
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
            candidates: list[ReplicaView] = []
            words: dict[str, str] = {}
            for r in here:
                if r.state not in _ALIVE or r.model not in models:
                    continue
                ok, why = _may_take(placer, entry, profile, use, r)
                if ok:
                    candidates.append(r)
                    if why:
                        words[r.id] = why
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
                taken = {v.id: words[v.id] for v in victims if v.id in words}
                best = _Choice(key, made, victims, tuple(yielding), profile, taken)
        if best is not None:
            break  # the model's preference order: a preferred profile that can be made room for wins
    if best is None:
        return None
    return _made(placer, model, best, use)


def _made(placer: Placer, model: str, best: _Choice, use: QuotaUse) -> tuple[Preemption, Room]:
    entry = placer.models[model]
    room = best.room
    need = gpus_needed(best.profile)
    gpus = tuple(room.free_gpus.get(best.profile.gpu_class, [])[:need]) if best.profile.gpu_class else ()
    room.take(model, best.profile, gpus, entry.weights_key)
    scope = within_guarantee(entry, best.profile, use) if best.taken_back else None
    preemption = Preemption(
        model,
        best.profile.name,
        room.name,
        tuple(v.id for v in best.victims),
        tuple(y.id for y in best.yielding),
        gpus,
        best.taken_back,
        scope.name if scope is not None else "",
    )
    return preemption, room


def commit_preemption(placer: Placer, preemption: Preemption, room: Room) -> None:
    """Hold the room `find_preemption` made for its model for the rest of the pass (and count the replica's
    GPUs against the model's quotas), so no other placement in the pass takes what the victims free."""
    placer.replace_room(room)
    entry = placer.models[preemption.model]
    profile = next(p for p in entry.spec.profiles if p.name == preemption.profile)
    placer.quota.add(entry, *shard_need(profile, len(preemption.gpus) or gpus_needed(profile)))
