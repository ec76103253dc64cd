"""Quotas: what the models a tenant (Organization, Team, Project) owns may hold, and what they are guaranteed.

Pure. What a scope holds is summed per class (a GPU class, or `cpu` for CPU profiles) from the replicas the
fleet holds (a stopping replica still holds its room until it is gone): GPUs, CPU cores and memory.
- A limit refuses a profile whose replica would take a scope past it (`quota_refusal`); the autoscaler asks
  `quota_room` how many more GPUs a model may take before it decides to scale.
- A guarantee is room a scope keeps whatever else wants it: a replica whose taking would leave one of its
  owner's scopes below its guarantee is never taken for another scope (`guarantee_keeps`), and a scope still
  within its guarantee takes back what other scopes hold beyond theirs (`within_guarantee`, `borrowed`), through
  preemption (placement.preempt). What a scope holds beyond its guarantee is borrowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmgw.core.config.models import CPU_CLASS, Profile
from llmgw.core.fleet.views import GIB, ModelView, ReplicaView
from llmgw.core.tenancy.limits import QuotaScope, Resources

__all__ = [
    "Held",
    "QuotaUse",
    "borrowed",
    "guarantee_keeps",
    "profile_need",
    "quota_refusal",
    "quota_room",
    "quota_use",
    "replica_gpus",
    "replica_need",
    "shard_need",
    "within_guarantee",
]

_HOLDING = frozenset({"pending", "starting", "ready", "failed", "draining", "stopping"})


@dataclass(frozen=True, slots=True)
class Held:
    """What a replica (or a scope) holds of one class."""

    gpus: int = 0
    cpu_cores: int = 0
    memory_bytes: int = 0

    def __add__(self, other: Held) -> Held:
        return Held(
            self.gpus + other.gpus, self.cpu_cores + other.cpu_cores, self.memory_bytes + other.memory_bytes
        )

    def __sub__(self, other: Held) -> Held:
        return Held(
            self.gpus - other.gpus, self.cpu_cores - other.cpu_cores, self.memory_bytes - other.memory_bytes
        )


def _gpus_per_node(profile: Profile) -> int:
    if profile.gpus:
        return profile.gpus
    return 1 if profile.gpu_class is not None else 0


def _class_of(profile: Profile) -> str:
    return profile.gpu_class if profile.gpu_class is not None else CPU_CLASS


def profile_need(profile: Profile) -> tuple[str, Held]:
    """(class, what one replica of the profile holds): every node's GPUs, cores and memory."""
    memory = 0 if profile.min_memory_gb is None else int(profile.min_memory_gb * GIB)
    per_node = Held(_gpus_per_node(profile), profile.cpu_cores or 0, memory)
    return _class_of(profile), Held(
        per_node.gpus * profile.nodes,
        per_node.cpu_cores * profile.nodes,
        per_node.memory_bytes * profile.nodes,
    )


def shard_need(profile: Profile, gpus: int) -> tuple[str, Held]:
    """(class, what one shard of the profile holds with `gpus` devices)."""
    memory = 0 if profile.min_memory_gb is None else int(profile.min_memory_gb * GIB)
    return _class_of(profile), Held(gpus, profile.cpu_cores or 0, memory)


def _profile(view: ModelView | None, name: str) -> Profile | None:
    if view is None:
        return None
    return next((p for p in view.spec.profiles if p.name == name), None)


def replica_need(view: ModelView | None, replica: ReplicaView) -> tuple[str, Held] | None:
    """(class, what the replica holds): the devices its shards report, else what its profile asks for; its
    profile's cores and memory on each of its shards. None when its model or profile is no longer declared."""
    profile = _profile(view, replica.profile)
    if profile is None:
        return None
    shards = max(1, len(replica.shards))
    cls, _ = profile_need(profile)
    reported = sum(len(s.gpus) for s in replica.shards)
    gpus = reported or _gpus_per_node(profile) * shards
    memory = 0 if profile.min_memory_gb is None else int(profile.min_memory_gb * GIB)
    return cls, Held(gpus, (profile.cpu_cores or 0) * shards, memory * shards)


def replica_gpus(view: ModelView | None, replica: ReplicaView) -> tuple[str, int] | None:
    """(GPU class, GPUs) a replica holds; None for a CPU replica, or one whose model or profile is gone."""
    profile = _profile(view, replica.profile)
    found = replica_need(view, replica)
    if profile is None or profile.gpu_class is None or found is None:
        return None
    return found[0], found[1].gpus


@dataclass(slots=True)
class QuotaUse:
    """What each scope holds per class; mutable during one placement pass (placements add to it)."""

    by_class: dict[tuple[str, str], Held] = field(default_factory=dict)  # (scope name, class) -> held

    @property
    def held(self) -> dict[tuple[str, str], int]:
        """GPUs held per (scope name, GPU class)."""
        return {k: v.gpus for k, v in self.by_class.items() if v.gpus}

    def of(self, scope: QuotaScope, cls: str) -> Held:
        return self.by_class.get((scope.name, cls), Held())

    def add(self, view: ModelView, cls: str, held: Held) -> None:
        for scope in view.quotas:
            key = (scope.name, cls)
            self.by_class[key] = self.by_class.get(key, Held()) + held


def quota_use(models: Mapping[str, ModelView], replicas: Iterable[ReplicaView]) -> QuotaUse:
    """What every quota scope holds now, from the replicas that hold hardware."""
    use = QuotaUse()
    for r in replicas:
        if r.state not in _HOLDING:
            continue
        view = models.get(r.model)
        found = replica_need(view, r)
        if view is not None and found is not None:
            use.add(view, *found)
    return use


def quota_room(view: ModelView, gpu_class: str, use: QuotaUse) -> int | None:
    """GPUs of `gpu_class` the model may still take under its owner's quotas (the tightest scope); None when
    no quota names that class for it."""
    rooms = [
        scope.gpus[gpu_class] - use.of(scope, gpu_class).gpus
        for scope in view.quotas
        if gpu_class in scope.gpus
    ]
    return max(0, min(rooms)) if rooms else None


_WORDS = (("gpus", "{cls}", 1), ("cpu_cores", "CPU cores{on}", 1), ("memory_bytes", "GB of memory{on}", GIB))


def _unit(unit: str, cls: str) -> str:
    """`4 h100-80g`, `4 CPU cores` (a CPU profile's), `64 CPU cores on h100-80g` (a GPU profile's host)."""
    return unit.format(cls=cls, on="" if cls == CPU_CLASS else f" on {cls}")


def _past(scope: QuotaScope, cls: str, held: Held, need: Held, limit: Resources) -> str | None:
    for name, unit, scale in _WORDS:
        most, have, more = getattr(limit, name), getattr(held, name), getattr(need, name)
        if most is not None and more and have + more > most:
            what = _unit(unit, cls)
            return (
                f"quota: {scope.name} may hold {most / scale:g} {what}, holds {have / scale:g}, "
                f"a replica needs {more / scale:g}"
            )
    return None


def quota_refusal(view: ModelView, profile: Profile, use: QuotaUse) -> str | None:
    """Why one more replica of this profile would break a quota, in words; None when it fits."""
    cls, need = profile_need(profile)
    for scope in view.quotas:
        limit = scope.limits.get(cls, Resources())
        if cls in scope.gpus:
            limit = Resources(scope.gpus[cls], limit.cpu_cores, limit.memory_bytes)
        refusal = _past(scope, cls, use.of(scope, cls), need, limit)
        if refusal is not None:
            return refusal
    return None


# ---------------------------------------------------------------------------------------------- guarantees


def _covers(given: Resources, held: Held) -> bool:
    """Whether `held` is within the guarantee on every resource it declares (and declares one)."""
    pairs = [
        (given.gpus, held.gpus),
        (given.cpu_cores, held.cpu_cores),
        (given.memory_bytes, held.memory_bytes),
    ]
    said = [(g, h) for g, h in pairs if g is not None]
    return bool(said) and all(h <= g for g, h in said)


def within_guarantee(view: ModelView, profile: Profile, use: QuotaUse) -> QuotaScope | None:
    """The nearest of the model's scopes that one more replica of `profile` leaves within its guarantee (what
    it may take back room for); None when none is."""
    cls, need = profile_need(profile)
    for scope in view.quotas:
        given = scope.guaranteed.get(cls)
        if given is not None and _covers(given, use.of(scope, cls) + need):
            return scope
    return None


def guarantee_keeps(victim: ModelView, cls: str, held: Held, use: QuotaUse, taker: ModelView) -> str | None:
    """Why a replica holding `held` of `cls` may not be taken for `taker`: one of its owner's scopes that the
    taker does not share would fall below its guarantee, in words. None when nothing keeps it."""
    shared = {s.name for s in taker.quotas}
    for scope in victim.quotas:
        given = scope.guaranteed.get(cls)
        if given is None or scope.name in shared:
            continue
        now = use.of(scope, cls)
        after = now - held
        for name, unit, scale in _WORDS:
            floor, before, left = getattr(given, name), getattr(now, name), getattr(after, name)
            if floor is not None and getattr(held, name) and left < floor:
                what = _unit(unit, cls)
                return (
                    f"within {scope.name}'s guarantee ({before / scale:g} of {floor / scale:g} {what} held)"
                )
    return None


def borrowed(victim: ModelView, cls: str, use: QuotaUse, scope: QuotaScope) -> str | None:
    """Words for a replica `scope` may take back (the caller has checked no guarantee keeps it): one of
    another tenant's, or of no tenant's. None when the replica's owner is `scope` or beneath it."""
    if any(s.name == scope.name for s in victim.quotas):
        return None
    keeping = [s for s in victim.quotas if s.guaranteed.get(cls) is not None]
    if not keeping:
        return f"borrowed: {victim.spec.owner or 'no owner'} has no {cls} guarantee"
    s = keeping[0]
    return f"borrowed: {s.name} holds {_amount(use.of(s, cls), s.guaranteed[cls], cls)}"


def _amount(held: Held, given: Resources, cls: str) -> str:
    for name, unit, scale in _WORDS:
        floor = getattr(given, name)
        if floor is not None:
            return f"{getattr(held, name) / scale:g} {_unit(unit, cls)}, {floor / scale:g} guaranteed"
    return "nothing guaranteed"
