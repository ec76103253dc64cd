"""GPU quotas: at most N GPUs of a GPU class held by the models a Team or Organization owns.

Pure. What a scope holds is summed from the replicas the fleet holds (a stopping replica still holds its
cards until it is gone); placement refuses a profile whose GPUs would take a scope past its quota, and the
autoscaler asks `quota_room` how many more GPUs a model may take before it decides to scale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.core.config.models import Profile
from llmgw.core.fleet.views import ModelView, ReplicaView

__all__ = ["QuotaUse", "quota_refusal", "quota_room", "quota_use", "replica_gpus"]

_HOLDING = frozenset({"pending", "starting", "ready", "failed", "draining", "stopping"})


def _gpus_per_node(profile: Profile) -> int:
    if profile.gpus:
        return profile.gpus
    return 1 if profile.gpu_class is not None else 0


def replica_gpus(view: ModelView | None, replica: ReplicaView) -> tuple[str, int] | None:
    """(GPU class, GPUs) a replica holds: the devices its shards report, else what its profile asks for.
    None for a CPU replica, or one whose model or profile is no longer declared (its class is unknown)."""
    if view is None:
        return None
    profile = next((p for p in view.spec.profiles if p.name == replica.profile), None)
    if profile is None or profile.gpu_class is None:
        return None
    reported = sum(len(s.gpus) for s in replica.shards)
    return profile.gpu_class, reported or _gpus_per_node(profile) * max(1, len(replica.shards))


@dataclass(slots=True)
class QuotaUse:
    """GPUs held per (scope name, GPU class); mutable during one placement pass (placements add to it)."""

    held: dict[tuple[str, str], int]

    def add(self, view: ModelView, gpu_class: str, gpus: int) -> None:
        for scope in view.quotas:
            if gpu_class in scope.gpus:
                key = (scope.name, gpu_class)
                self.held[key] = self.held.get(key, 0) + gpus


def quota_use(models: Mapping[str, ModelView], replicas: Iterable[ReplicaView]) -> QuotaUse:
    """What every quota scope holds now, from the replicas that hold hardware."""
    use = QuotaUse({})
    for r in replicas:
        if r.state not in _HOLDING:
            continue
        view = models.get(r.model)
        found = replica_gpus(view, r)
        if view is not None and found is not None:
            use.add(view, *found)
    return use


def quota_room(view: ModelView, gpu_class: str, use: QuotaUse) -> int | None:
    """GPUs of `gpu_class` the model may still take under its owner's quotas (the tightest scope); None when
    no quota names that class for it."""
    rooms = [
        scope.gpus[gpu_class] - use.held.get((scope.name, gpu_class), 0)
        for scope in view.quotas
        if gpu_class in scope.gpus
    ]
    return max(0, min(rooms)) if rooms else None


def quota_refusal(view: ModelView, profile: Profile, use: QuotaUse) -> str | None:
    """Why one more replica of this profile would break a quota, in words; None when it fits."""
    if profile.gpu_class is None:
        return None
    need = _gpus_per_node(profile) * profile.nodes
    for scope in view.quotas:
        limit = scope.gpus.get(profile.gpu_class)
        if limit is None:
            continue
        held = use.held.get((scope.name, profile.gpu_class), 0)
        if held + need > limit:
            return (
                f"quota: {scope.name} may hold {limit} {profile.gpu_class}, holds {held}, "
                f"a replica needs {need}"
            )
    return None
