"""The autoscaler's shell: each pass, the pure decision (llmgw.core.fleet.autoscale) for every model that may scale,
from the routers' load reports and each replica's capacity (measured, else the profile's slots).

It keeps each model's state and last decision on its `ModelRecord` (status, the admin API and metrics show
them) and hands the reconciler the counts; a change of count is an event ("scaled chat 2->4: queue 37, ...").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmgw.core.fleet.autoscale import Capacity, ScalePolicy, assumed_capacity, decide

if TYPE_CHECKING:
    from llmgw.controller.parts.desired import Desired
    from llmgw.controller.parts.fleet import LiveFleet
    from llmgw.store.queries.capacity import CapacityRecord
    from llmgw.store.store import Store

__all__ = ["ScalePass", "autoscale", "capacity_of", "gpu_class_of", "load_capacities", "remember"]


@dataclass(frozen=True)
class ScalePass:
    scale_to: dict[str, int]
    wake_at: float | None
    events: list[tuple[str, str, bool]]  # (model, words, up) for each count that moved


def capacity_of(d: Desired, fleet: LiveFleet, model: str) -> Capacity:
    """What one replica of `model` serves at once: measured for the profile most of its replicas run (else
    its first), else that profile's slots; unknown when neither is there."""
    entry = d.models[model]
    running = [r.profile for r in fleet.replicas.values() if r.model == model and not r.stopping]
    names = [p.name for p in entry.profiles]
    profile = max(set(running), key=running.count) if running else (names[0] if names else None)
    found = entry.profile(profile) if profile is not None else None
    if found is None:
        return Capacity(None, "unknown")
    measured = fleet.capacities.get((model, found.profile.name))
    if measured is not None:
        return measured
    p = found.profile
    per = assumed_capacity(p.slots, p.engine, p.args)
    return Capacity(per, "slots" if per is not None else "unknown")


def autoscale(d: Desired | None, fleet: LiveFleet, now: float, policy: ScalePolicy) -> ScalePass:
    """Decide every model whose scaling leaves room (max above min) and that runs on replicas."""
    ws = fleet.worker_state
    if d is None:
        return ScalePass({}, None, [])
    demand = ws.model_demand()
    scale_to: dict[str, int] = {}
    wakes: list[float] = []
    events: list[tuple[str, str, bool]] = []
    for name, entry in sorted(d.models.items()):
        scaling = entry.spec.scaling
        record = ws.model(name)
        if not entry.spec.profiles or scaling.max <= scaling.min:
            record.scale, record.scaled = None, None
            continue
        current = sum(1 for r in fleet.replicas.values() if r.model == name and not r.stopping)
        slo = entry.spec.slo
        # An on-demand model (min 0) is scaled between 1 and max while it runs: going to none is
        # idle_timeout's (the reconciler's), not a quiet minute's.
        floor = scaling.min if scaling.min > 0 or current == 0 else 1
        decision = decide(
            name,
            min_replicas=floor,
            max_replicas=scaling.max,
            current=current,
            demand=demand.get(name),
            capacity=capacity_of(d, fleet, name),
            objective_ms=slo.ttft_p99_ms if slo is not None else None,
            now=now,
            state=record.scale,
            policy=policy,
        )
        record.scale, record.scaled = decision.state, decision
        # An on-demand model (min 0) with no load report keeps to its ask-and-idle rule.
        if scaling.min > 0 or demand.get(name) is not None:
            scale_to[name] = decision.desired
        if decision.wake_at is not None:
            wakes.append(decision.wake_at)
        if decision.event is not None and decision.changed_from is not None:
            events.append((name, decision.event, decision.desired > decision.changed_from))
    return ScalePass(scale_to, min(wakes) if wakes else None, events)


# END


def gpu_class_of(d: Desired | None, model: str, profile: str) -> str:
    entry = d.models.get(model) if d else None
    found = entry.profile(profile) if entry else None
    return (found.profile.gpu_class or "") if found is not None else ""


def remember(fleet: LiveFleet, rec: CapacityRecord) -> None:
    """Keep a stored measurement for the autoscaler (by model and profile; a concurrency of None is unknown)."""
    fleet.capacities[(rec.model, rec.profile)] = Capacity(rec.concurrency, "measured", rec.measured_at)
    if rec.load_s is not None:  # by model: a router holds a model's requests, whichever profile loads
        model = fleet.worker_state.model(rec.model)
        model.bench_load_s = max(rec.load_s, model.bench_load_s or 0.0)


async def load_capacities(store: Store, d: Desired | None, fleet: LiveFleet) -> None:
    """Read what was measured into the controller (at start); a store that does not answer is retried by the
    caller's next attempt, and until then capacity is assumed from slots."""
    for rec in await store.list_capacity():
        if rec.gpu_class == gpu_class_of(d, rec.model, rec.profile):
            remember(fleet, rec)
