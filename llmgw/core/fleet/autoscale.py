"""Autoscaling as a pure decision: how many replicas a model should have, and why, from what routers report.

`decide(...)` takes one model's bounds, the replica count it is at, the demand the routers reported (queue
depth, requests in flight, p99 TTFT, refusals), what one replica can serve (measured by `llmgw bench`, else
assumed from the profile's slots), the state carried from the last decision and the time, and returns the
count to aim at with the words that explain it ("scaled chat 2->4: queue 37, in flight 12, capacity 16").

Rules:
- load = queued + in flight + refused since the last report: requests the model was asked to serve now;
- up: ceil(load / capacity per replica) when that is more than the count held; a p99 TTFT over the model's
  objective while requests queue asks for one more. Up moves straight to what the load needs (a burst is
  answered in one step), then waits `up_cooldown` before moving up again, so replicas that are still loading
  are not asked for twice;
- down, with hysteresis: only to a count whose replicas would stay under `down_utilization` of their capacity
  (so the count reached going down is never one the same load would scale up from), and only once the load
  has stayed that low for `down_cooldown`;
- never outside [min, max]; a load report that is missing or older than `stale_after` is unknown, not zero:
  the count is held. So is a capacity nobody measured or declared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "LOAD_TIMES_KEPT",
    "Capacity",
    "Demand",
    "ScaleDecision",
    "ScalePolicy",
    "ScaleState",
    "assumed_capacity",
    "decide",
    "merge_demand",
    "published_load_seconds",
]

CapacitySource = Literal["measured", "slots", "unknown"]


@dataclass(frozen=True, slots=True)
class Demand:
    """One model's load, summed over the routers that reported it (at: the oldest of their reports)."""

    queued: int = 0
    inflight: int = 0
    refused: int = 0
    ttft_p99_ms: float | None = None  # None: no request finished its first token in the window
    at: float = 0.0

    @property
    def load(self) -> int:
        return self.queued + self.inflight + self.refused


@dataclass(frozen=True, slots=True)
class Capacity:
    """Concurrent sequences one replica serves within the model's objective. None: nobody knows."""

    per_replica: int | None
    source: CapacitySource
    measured_at: float | None = None


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    up_cooldown: float = 15.0  # seconds after a scale-up before the next one
    down_cooldown: float = 60.0  # seconds the load must stay low before a scale-down
    down_utilization: float = 0.7  # the replicas left after a scale-down stay under this share of capacity
    stale_after: float = 30.0  # a load report older than this is unknown


@dataclass(frozen=True, slots=True)
class ScaleState:
    """What one decision hands the next: the count aimed at, the last scale-up, since when the load fits fewer."""

    desired: int | None = None
    last_up_at: float | None = None
    low_since: float | None = None


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    desired: int
    reason: str
    state: ScaleState
    wake_at: float | None = None  # when the decision may change with the same input (a cool-down ends)
    changed_from: int | None = None  # the count before, when this decision moved it

    @property
    def event(self) -> str | None:
        """The event's words when the count moved ("scaled chat 2->4: ...")."""
        return None if self.changed_from is None else self.reason


def assumed_capacity(slots: int | None, engine: str, args: Mapping[str, object]) -> int | None:
    """What a replica is assumed to serve at once without a measurement: its declared slots, or for the sim the
    `max_concurrency` it is told to run with (the sim's own slots). None: not declared."""
    if slots is not None:
        return slots
    value = args.get("max_concurrency") if engine == "sim" else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def merge_demand(reports: list[Demand]) -> Demand | None:
    """Several routers' reports of one model as one: counts add, the worst p99 counts, the oldest time."""
    if not reports:
        return None
    ttfts = [r.ttft_p99_ms for r in reports if r.ttft_p99_ms is not None]
    return Demand(
        queued=sum(r.queued for r in reports),
        inflight=sum(r.inflight for r in reports),
        refused=sum(r.refused for r in reports),
        ttft_p99_ms=max(ttfts) if ttfts else None,
        at=min(r.at for r in reports),
    )


def _words(demand: Demand, capacity: Capacity, objective_ms: float | None) -> str:
    parts = [f"queue {demand.queued}", f"in flight {demand.inflight}"]
    if demand.refused:
        parts.append(f"refused {demand.refused}")
    if demand.ttft_p99_ms is not None:
        slo = f" (objective {objective_ms:g} ms)" if objective_ms is not None else ""
        parts.append(f"p99 TTFT {demand.ttft_p99_ms:.0f} ms{slo}")
    parts.append(f"capacity {capacity.per_replica} per replica ({capacity.source})")
    return ", ".join(parts)


def decide(
    model: str,
    *,
    min_replicas: int,
    max_replicas: int,
    current: int,
    demand: Demand | None,
    capacity: Capacity,
    objective_ms: float | None,
    now: float,
    state: ScaleState | None = None,
    policy: ScalePolicy | None = None,
) -> ScaleDecision:
    """One model's replica count between min and max. `current`: replicas it has now (any state short of
    stopping); the count held between decisions is `state.desired` (replicas still loading count)."""
    policy = policy or ScalePolicy()
    state = state or ScaleState()
    lo, hi = min_replicas, max(min_replicas, max_replicas)
    held = state.desired if state.desired is not None else current
    base = max(lo, min(held, hi))
    fresh = demand is not None and now - demand.at <= policy.stale_after
    if demand is None or not fresh or capacity.per_replica is None:
        why = (
            "no load report"
            if demand is None
            else f"load report {now - demand.at:.0f}s old"
            if not fresh
            else "capacity unknown (run llmgw bench MODEL --save, or declare the profile's slots)"
        )
        return ScaleDecision(base, f"held at {base}: {why}", replace(state, desired=base, low_since=None))
    per = capacity.per_replica
    load = demand.load
    need = math.ceil(load / per)
    slo_missed = (
        objective_ms is not None and demand.ttft_p99_ms is not None and demand.ttft_p99_ms > objective_ms
    )
    if slo_missed and demand.queued > 0:
        need = max(need, base + 1)
    need = max(lo, min(need, hi))
    words = _words(demand, capacity, objective_ms)
    if need > base:
        if state.last_up_at is not None and now - state.last_up_at < policy.up_cooldown:
            until = state.last_up_at + policy.up_cooldown
            reason = f"held at {base} (wants {need}; scale-up cool-down for {until - now:.0f}s): {words}"
            return ScaleDecision(base, reason, replace(state, desired=base, low_since=None), until)
        new = ScaleState(desired=need, last_up_at=now, low_since=None)
        return ScaleDecision(
            need, f"scaled {model} {base}->{need}: {words}", new, now + policy.up_cooldown, base
        )
    # Down only to a count that stays under the utilisation mark: never one the same load scales up from.
    fits = max(lo, min(hi, math.ceil(load / (per * policy.down_utilization))))
    if fits < base:
        low_since = state.low_since if state.low_since is not None else now
        until = low_since + policy.down_cooldown
        if now < until:
            reason = f"held at {base} (load fits {fits}; scale-down after {until - now:.0f}s more): {words}"
            return ScaleDecision(base, reason, replace(state, desired=base, low_since=low_since), until)
        new = replace(state, desired=fits, low_since=None)
        return ScaleDecision(fits, f"scaled {model} {base}->{fits}: {words}", new, None, base)
    return ScaleDecision(base, f"at {base}: {words}", replace(state, desired=base, low_since=None))


LOAD_TIMES_KEPT = 5  # the recent loads a model's published load time is taken from


def published_load_seconds(observed: Sequence[float], measured: float | None) -> float | None:
    """The load time routers hold requests for (llmgw.core.snapshot PublishedModel.load_seconds): the
    slowest of the recent loads this controller watched, else what `llmgw bench --save` measured, else
    None (unknown: routers fall back to their load_timeout). The slowest, not the mean: it sizes a hold,
    and a hold shorter than a real load refuses requests that would have been served."""
    recent = list(observed)[-LOAD_TIMES_KEPT:]
    if recent:
        return max(recent)
    return measured
