"""The reconciler's decisions: desired against live, one pass, as values.

`reconcile(...)` is pure: it takes the catalog view, the nodes, the replicas, the backoff carried per model,
when each model was last used, what is being asked for, the time and a seeded random source, and returns the
actions to carry out (frozen values), the new backoff state and when to wake up next. The controller's I/O
shell carries the actions out through the agents; tests carry them out on a fake fleet with a fake clock.

Rules (each learned the hard way, see docs/placement.md):
- scale to `scaling.min`; on-demand models (min 0) start up to `max` only when asked and stop after
  `idle_timeout` without use;
- one failed shard fails the whole replica: every shard is stopped and the replica replaced, after a jittered
  exponential backoff carried on the model (not on the replica that was just destroyed);
- replicas on a Lost node are replaced elsewhere; on an Unreachable node they are left alone (a network blip
  must not tear down replicas that are serving);
- replicas of models no longer in the catalog are stopped;
- replicas on a node removed from the repo (`NodeView.leaving`) are replaced elsewhere first and stopped once
  the model has its target ready without them (make-before-break); right away when nothing can replace them;
- scale-down drains before stopping, the idlest replica first (fewest requests in flight, longest since its
  last request; one no router reported on is not taken for idle); between min and max the autoscaler's count
  (`scale_to`, llmgw.core.fleet.autoscale) replaces "keep what runs";
- a replica whose profile fingerprint differs from the catalog's is marked stale; it is rolled only when the
  model says `rollout.on_change: restart` (or an operator asks, `llmgw restart`): make-before-break, at most
  `max_surge` replicas beyond the target and at most `max_unavailable` ready ones missing below it;
- adopted replicas (found running after a controller restart or a fail-over) are those replicas again: one
  whose fingerprint differs is rolled like any other, so a restart changes nothing a commit asked for;
- models are placed highest capacity class first; one that still cannot be placed has replicas of strictly
  lower classes drained and stopped to make room (llmgw.core.placement.preempt), and is placed once they
  are gone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from llmgw.core.fleet.states import GONE_STATES, is_stale
from llmgw.core.fleet.views import ModelState, ModelView, NodeView, ReplicaView
from llmgw.core.placement import (
    IdFactory,
    Placer,
)
from llmgw.core.reconcile_actions import (
    Action,
    BackoffPolicy,
    CanaryPhase,
    MarkStale,
    Mode,
    ReconcileDecision,
    RestartReplica,
    RollPace,
    StartReplica,
    StopReplica,
    Wait,
)
from llmgw.core.reconcile_placing import ModelPass, place_all
from llmgw.core.words import parse_duration

__all__ = [
    "Action",
    "BackoffPolicy",
    "CanaryPhase",
    "MarkStale",
    "ReconcileDecision",
    "RestartReplica",
    "RollPace",
    "StartReplica",
    "StopReplica",
    "Wait",
    "reconcile",
    "replica_stale",
]


def replica_stale(replica: ReplicaView, entry: ModelView) -> bool:
    """The replica against its model's entry, by the fleet's one rule (fleet/states.is_stale)."""
    declared = any(p.name == replica.profile for p in entry.spec.profiles)
    wanted = entry.fingerprints.get(replica.profile, "") if declared else None
    return is_stale(replica.fingerprint, wanted)


@dataclass(frozen=True, slots=True)
class _Nodes:
    """The nodes as one pass reads them."""

    state: Mapping[str, str]  # by node name; a node nobody reports is absent
    leaving: frozenset[str]  # removed from the repo or drained: their replicas move elsewhere
    held: frozenset[str]  # drained but still in the repo

    @classmethod
    def of(cls, nodes: Sequence[NodeView]) -> _Nodes:
        return cls(
            state={n.name: n.state for n in nodes},
            leaving=frozenset(n.name for n in nodes if n.leaving or n.drained),
            held=frozenset(n.name for n in nodes if n.drained and not n.leaving),
        )


def reconcile(
    models: Mapping[str, ModelView],
    nodes: Iterable[NodeView],
    replicas: Iterable[ReplicaView],
    *,
    now: float,
    rng: random.Random,
    backoff: Mapping[str, ModelState] | None = None,
    last_used: Mapping[str, float] | None = None,
    demand: Mapping[str, int] | None = None,
    policy: BackoffPolicy | None = None,
    new_id: IdFactory | None = None,
    mode: Mode = "run",
    idle_default: float | None = None,
    scale_to: Mapping[str, int] | None = None,
    idleness: Mapping[str, tuple[int, float | None]] | None = None,
    paces: Mapping[str, RollPace] | None = None,
    canaries: Mapping[str, CanaryPhase] | None = None,
) -> ReconcileDecision:
    """One reconcile pass. `demand`: replicas asked for per model (the router's on-demand signal);
    `scale_to`: the autoscaler's count per model (llmgw.core.fleet.autoscale), kept within [min, max];
    `idleness`: per replica id, requests in flight and when it last took one (None: unknown), so a scale-down
    stops the idlest replica;
    `last_used`: when each model last served a request. `mode="plan"` shows the whole way to the desired
    state: every stale restart at once, no backoff, no idle stops (they are runtime, not repo changes).
    `idle_default`: seconds unused after which replicas above min stop, for models without `idle_timeout`
    (None: they stay). `paces`: a roll's pace per model when an operator gave one (`llmgw restart
    --max-surge`), else the model's `rollout` block's. `canaries`: the phase of each model's canary
    (`rollout.strategy: canary`; none yet is a canary starting)."""
    nodes = tuple(nodes)
    replicas = tuple(sorted(replicas, key=lambda r: r.id))
    policy = policy or BackoffPolicy()
    backoff = backoff or {}
    last_used = last_used or {}
    demand = demand or {}
    scale_to = scale_to or {}
    idleness = idleness or {}
    paces = paces or {}
    canaries = canaries or {}
    fleet = _Nodes.of(nodes)

    actions: list[Action] = list(_removed_models(models, replicas, fleet.state))
    passes = []
    for name in sorted(models):
        mp = ModelPass(name, models[name], backoff.get(name, ModelState()))
        _take_stock(mp, [r for r in replicas if r.model == name], fleet, now, rng, policy)
        phase = canaries.get(name, CanaryPhase()) if mode == "run" else CanaryPhase("promoted")
        _stale(mp, phase)
        pace = paces.get(name) or _pace_of(mp.entry)
        wanted = scale_to.get(name) if mode == "run" else None
        scale = _ScaleAsk(last_used.get(name), demand.get(name, 0), wanted, idleness)
        _scale(mp, pace, now, scale, mode, idle_default, phase)
        passes.append(mp)

    placer = Placer(models, nodes, replicas, new_id)
    unplaced = place_all(passes, placer, replicas, mode)
    for mp in passes:
        _release_leaving(mp, fleet.leaving, fleet.held, unplaced.get(mp.name, 0))
        actions.extend(mp.actions)
    return _decision(actions, passes, unplaced, now)


def _decision(
    actions: Sequence[Action], passes: Sequence[ModelPass], unplaced: dict[str, int], now: float
) -> ReconcileDecision:
    """The pass's outcome: the actions in order, the backoff to carry, the next wake-up, each model's target."""
    new_backoff = {mp.name: mp.state for mp in passes if mp.state != ModelState()}
    wakes = [w for mp in passes for w in mp.wakes if w > now]
    wake_at = min(wakes) if wakes else None
    targets = {mp.name: mp.target for mp in passes}
    return ReconcileDecision(tuple(_ordered(actions)), new_backoff, wake_at, unplaced, targets)


def _ordered(actions: Sequence[Action]) -> list[Action]:
    """Stops first (they free room), then marks and restarts, then starts, then waits."""
    rank = {StopReplica: 0, MarkStale: 1, RestartReplica: 2, StartReplica: 3, Wait: 4}
    return sorted(actions, key=lambda a: rank[type(a)])


def _lost(r: ReplicaView, node_state: Mapping[str, str]) -> list[str]:
    """The Lost nodes a replica has shards on; a node nobody reports any more counts as Lost."""
    return sorted({s.node for s in r.shards if node_state.get(s.node, "Lost") == "Lost"})


def _removed_models(
    models: Mapping[str, ModelView], replicas: Sequence[ReplicaView], node_state: Mapping[str, str]
) -> Iterable[Action]:
    for r in replicas:
        if r.model in models or r.state == "stopped":
            continue
        reason = f"model {r.model} is no longer in the cluster repo"
        lost = _lost(r, node_state)
        if lost:
            yield StopReplica(r.id, f"{reason}; node {', '.join(lost)} is Lost", drain=False, forget=True)
        elif r.effective_state() not in GONE_STATES:
            yield StopReplica(r.id, reason, drain=r.effective_state() != "failed")


def _take_stock(
    mp: ModelPass,
    mine: Sequence[ReplicaView],
    fleet: _Nodes,
    now: float,
    rng: random.Random,
    policy: BackoffPolicy,
) -> None:
    """What became of the model's replicas: failed and lost ones replaced (the backoff counts failures), ones on
    Unreachable nodes kept, ones on leaving nodes set to move."""
    _failed_and_lost(mp, mine, fleet.state, now, rng, policy)
    _reset_backoff(mp, now, policy)
    _unreachable(mp, fleet.state)
    _leaving(mp, fleet.leaving, fleet.held)


def _failed_and_lost(
    mp: ModelPass,
    mine: Sequence[ReplicaView],
    node_state: Mapping[str, str],
    now: float,
    rng: random.Random,
    policy: BackoffPolicy,
) -> None:
    present = {r.id for r in mine}
    state = replace(mp.state, counted=frozenset(i for i in mp.state.counted if i in present))
    for r in mine:
        eff = r.effective_state()
        lost = _lost(r, node_state) if r.state != "stopped" else []
        if lost:
            # Checked first: a replica draining or failed on a Lost node will never report stopping.
            where = ", ".join(lost)
            reason = f"node {where} is Lost; replaced elsewhere"
            mp.actions.append(StopReplica(r.id, reason, drain=False, forget=True))
            if eff not in GONE_STATES:
                mp.start_reasons.append((f"replaces {r.id} (node {where} is Lost)", r.id))
            continue
        if eff in GONE_STATES:
            continue
        if eff == "failed":
            mp.actions.append(StopReplica(r.id, _failure_words(r), drain=False))
            mp.start_reasons.append((f"replaces {r.id} (failed)", r.id))
            if r.id not in state.counted:
                failures = state.failures + 1
                state = ModelState(
                    failures=failures,
                    not_before=now + policy.delay(failures, rng),
                    counted=state.counted | {r.id},
                )
            continue
        mp.alive.append(r)
    mp.state = state


def _failure_words(r: ReplicaView) -> str:
    failed = [s for s in r.shards if s.state == "failed"]
    if not failed:
        return "replica failed"
    which = ", ".join(f"shard {s.rank} on {s.node}" for s in failed)
    others = "; stopping every shard" if len(r.shards) > 1 else ""
    return f"{which} failed{others}"


def _reset_backoff(mp: ModelPass, now: float, policy: BackoffPolicy) -> None:
    if mp.state.failures == 0:
        return
    since = [r.ready_since for r in mp.alive if r.ready_since is not None and r.effective_state() == "ready"]
    if any(now - s >= policy.reset_after for s in since):
        mp.state = ModelState(counted=mp.state.counted)
    elif since:
        mp.wakes.append(min(since) + policy.reset_after)


def _unreachable(mp: ModelPass, node_state: Mapping[str, str]) -> None:
    for r in mp.alive:
        away = sorted({s.node for s in r.shards if node_state.get(s.node) == "Unreachable"})
        if away:
            reason = f"{r.id} is on Unreachable node {', '.join(away)}: kept until the node is Lost"
            mp.actions.append(Wait(mp.name, None, reason))


def _leaving(mp: ModelPass, leaving_nodes: frozenset[str], held_nodes: frozenset[str]) -> None:
    """Take replicas on nodes removed from the repo out of `alive` and ask for their replacements; they keep
    serving until `_release_leaving` lets them go."""
    if not leaving_nodes:
        return
    for r in [r for r in mp.alive if any(s.node in leaving_nodes for s in r.shards)]:
        mp.alive.remove(r)
        mp.leaving.append(r)
        where = ", ".join(sorted({s.node for s in r.shards if s.node in leaving_nodes}))
        mp.start_reasons.append((f"replaces {r.id} (node {where} {_gone_words(r, held_nodes)})", r.id))


def _release_leaving(
    mp: ModelPass, leaving_nodes: frozenset[str], held_nodes: frozenset[str], unplaced: int
) -> None:
    """Make-before-break: leaving replicas keep serving while they stand in for replicas elsewhere that are
    not ready yet, so a model at min 1 is never without a ready replica. What the model will have elsewhere
    is its target less what no node can take (in backoff or settling too: those are still coming); leaving
    replicas beyond what covers the gap to that, and any not serving anyway, are stopped now. So with no
    room elsewhere they go at once: waiting would only hold up the node's removal. A drained node
    (`held_nodes`, `llmgw node drain`) is kept for maintenance, not removed: there a replica nothing can
    replace keeps serving, and the drain says so, rather than taking the model down."""

    def where(r: ReplicaView) -> str:
        return ", ".join(sorted({s.node for s in r.shards if s.node in leaving_nodes}))

    ready = sum(1 for r in mp.alive if r.effective_state() == "ready")
    serving = [r for r in mp.leaving if r.effective_state() == "ready"]
    keep = max(0, mp.target - unplaced - ready)
    tail = f"; {unplaced} replacement(s) cannot be placed (llmgw explain {mp.name})" if unplaced else ""
    for r in mp.leaving:
        if r not in serving:
            reason = f"node {where(r)} {_gone_words(r, held_nodes)}; not serving, stopped without waiting"
        elif serving.index(r) >= keep and unplaced and any(s.node in held_nodes for s in r.shards):
            words = f"{r.id} on drained node {where(r)} keeps serving: its replacement cannot be placed"
            mp.actions.append(Wait(mp.name, None, words + f" (llmgw explain {mp.name})"))
            continue
        elif serving.index(r) >= keep:
            reason = f"node {where(r)} {_gone_words(r, held_nodes)}; {ready} ready replica(s) elsewhere{tail}"
        else:
            gone = "drained" if any(s.node in held_nodes for s in r.shards) else "removed"
            words = f"{r.id} on {gone} node {where(r)} serves until its replacement is ready"
            mp.actions.append(Wait(mp.name, None, words))
            continue
        mp.actions.append(StopReplica(r.id, reason, drain=True))


def _gone_words(r: ReplicaView, held_nodes: frozenset[str]) -> str:
    return "drained" if any(s.node in held_nodes for s in r.shards) else "removed from the repo"


def _stale(mp: ModelPass, phase: CanaryPhase) -> None:
    """Mark stale replicas; note the ones to roll: stale ones when the model rolls on a change (adopted ones
    too: a controller restart changes nothing a commit asked for), and every one an operator asked to restart. A canary model rolls on a change through
    its canary; once the canary failed its stale replicas are held (they are the stable ones) and its
    canary replicas are stopped, drained."""
    canary = mp.entry.spec.rollout.strategy == "canary"
    auto = mp.entry.spec.restarts_on_change or (canary and phase.phase != "failed")
    if canary and phase.phase == "failed":
        for r in [r for r in mp.alive if r.id in phase.replicas]:
            mp.alive.remove(r)
            mp.actions.append(StopReplica(r.id, "canary failed its gates: rolled back", drain=True))
    for r in mp.alive:
        stale = replica_stale(r, mp.entry)
        if stale and not r.stale:
            mp.actions.append(MarkStale(r.id, f"profile {r.profile} changed since {r.id} was placed"))
        if r.restart or (stale and auto):
            mp.rolling.append(r)


def _pace_of(entry: ModelView) -> RollPace:
    rollout = entry.spec.rollout
    return RollPace(rollout.max_surge, rollout.max_unavailable)


@dataclass(frozen=True, slots=True)
class _ScaleAsk:
    """What asks one model for a count: its last use, the on-demand ask, the autoscaler, replicas' idleness."""

    last_used: float | None
    asked: int
    wanted: int | None
    idleness: Mapping[str, tuple[int, float | None]]


def _scale(
    mp: ModelPass,
    pace: RollPace,
    now: float,
    ask: _ScaleAsk,
    mode: Mode,
    idle_default: float | None,
    phase: CanaryPhase,
) -> None:
    scaling = mp.entry.spec.scaling
    if not mp.entry.spec.profiles:  # served by a provider
        return
    last_used, asked = ask.last_used, ask.asked
    # A replacement beside the replica it replaces (a roll's surge, a leaving node's) is not one more.
    rolling = {r.id for r in mp.rolling}
    leaving = {r.id for r in mp.leaving}
    surplus = sum(1 for r in mp.alive if r.replaces in rolling)  # both in `alive`
    count = len(mp.alive) + len(mp.leaving) - surplus - sum(1 for r in mp.alive if r.replaces in leaving)
    # The autoscaler's count replaces "keep what runs" (which only ever grew by an ask).
    held = count if ask.wanted is None else ask.wanted
    target = max(scaling.min, min(held, scaling.max))
    idle_words = ""
    if mode == "run":
        target = max(target, min(asked, scaling.max))
        idle = parse_duration(scaling.idle_timeout) if scaling.idle_timeout is not None else idle_default
        if idle is not None and count > scaling.min:
            created = [r.created_at for r in mp.alive]
            activity = max([last_used if last_used is not None else -math.inf, *created])
            if now - activity >= idle:
                target = max(scaling.min, min(asked, scaling.max))
                idle_words = f" (unused for {scaling.idle_timeout or f'{idle:g}s'})"
            else:
                mp.wakes.append(activity + idle)
    mp.target = target
    held = mp.entry.spec.rollout.strategy == "canary" and phase.phase != "promoted"
    if mp.rolling and held and mode == "run" and not any(r.restart for r in mp.rolling):
        _canary_hold(mp, blocked=mp.state.not_before > now)
        return
    if mp.rolling:
        if mode == "run":
            _roll(mp, target, pace, blocked=mp.state.not_before > now)
        else:
            _roll(mp, target, RollPace(len(mp.rolling), len(mp.rolling)), blocked=False)
        return
    have = len(mp.alive) - surplus
    if have < target:
        _want(mp, target - have, target, ask, now, mode)
    elif have > target:
        why = idle_words or (" (autoscaled: the routers' load fits fewer)" if ask.wanted is not None else "")
        _scale_down(mp, have - target, target, why, ask.idleness)
    else:
        mp.start_reasons.clear()


def _roll_why(r: ReplicaView) -> str:
    if r.restart:
        return "restart asked for"
    return f"profile {r.profile} changed (rollout.on_change: restart)"


def _roll(mp: ModelPass, target: int, pace: RollPace, *, blocked: bool) -> None:
    """Make-before-break: stop old replicas while at least `target - max_unavailable` stay ready, start
    their replacements while at most `target + max_surge` run. Not-ready old ones go first (they serve
    nothing); a plan (`mode="plan"`) shows the whole way at once."""
    rolling = {r.id for r in mp.rolling}
    fresh = [r for r in mp.alive if r.id not in rolling]
    ready = sum(1 for r in mp.alive if r.effective_state() == "ready")
    floor = target - pace.max_unavailable
    for r in sorted(mp.rolling, key=lambda r: (r.effective_state() == "ready", r.created_at, r.id)):
        serving = r.effective_state() == "ready"
        if serving and ready - 1 < floor:
            continue
        mp.alive.remove(r)
        ready -= serving
        mp.actions.append(RestartReplica(r.id, _roll_why(r)))
    replaced = {r.replaces for r in fresh}
    unreplaced = [r for r in mp.rolling if r.id not in replaced]
    starts = max(0, min(target - len(fresh), target + pace.max_surge - len(mp.alive)))
    if blocked:  # backing off after failures: no new replica until it ends (the next pass after it)
        starts = 0
        mp.wakes.append(mp.state.not_before)
    reasons: list[tuple[str, str | None]] = [
        (f"replaces {r.id} ({_roll_why(r)})", r.id) for r in unreplaced[:starts]
    ]
    reasons += [(f"rolling toward {target} replicas", None)] * (starts - len(reasons))
    mp.start_reasons = reasons
    left = sum(1 for r in mp.rolling if r in mp.alive)
    words = (
        f"rolling: {left} old replica(s) left to replace; {ready} of {target} ready, max_surge "
        f"{pace.max_surge}, max_unavailable {pace.max_unavailable}"
    )
    mp.actions.append(Wait(mp.name, None, words))


def _canary_hold(mp: ModelPass, *, blocked: bool) -> None:
    """A change under a canary: one new replica beside the stable (stale) ones, started as the first
    stale one's replacement so it counts as a surge, not as one more; nothing stale stops until the
    canary is promoted, when the roll goes on from it (`_roll`)."""
    rolling = {r.id for r in mp.rolling}
    fresh = [r for r in mp.alive if r.id not in rolling]
    first = sorted(mp.rolling, key=lambda r: (r.created_at, r.id))[0]
    starts = 0 if fresh or blocked else 1
    if blocked and not fresh:
        mp.wakes.append(mp.state.not_before)
    mp.start_reasons = [(f"canary beside {len(mp.rolling)} stable replica(s)", first.id)] * starts
    words = f"canary: {len(fresh) or starts} new replica(s) beside {len(mp.rolling)} stable; the gates decide"
    mp.actions.append(Wait(mp.name, None, words))


def _want(mp: ModelPass, missing: int, target: int, ask: _ScaleAsk, now: float, mode: Mode) -> None:
    if mode == "run" and mp.state.not_before > now:
        failures = mp.state.failures
        mp.actions.append(
            Wait(mp.name, mp.state.not_before, f"backing off after {failures} failure{'s' * (failures != 1)}")
        )
        mp.wakes.append(mp.state.not_before)
        mp.start_reasons.clear()
        return
    scaling = mp.entry.spec.scaling
    if target <= scaling.min:
        default = f"scale to min {scaling.min}"
    elif ask.wanted is not None and ask.wanted >= target:
        default = f"autoscaled to {target} (the routers' load)"
    else:
        default = f"asked for ({ask.asked} wanted)"
    reasons = mp.start_reasons[:missing]
    reasons += [(default, None)] * (missing - len(reasons))
    mp.start_reasons = reasons


def _scale_down(
    mp: ModelPass,
    extra: int,
    target: int,
    idle_words: str,
    idleness: Mapping[str, tuple[int, float | None]],
) -> None:
    mp.start_reasons.clear()

    def order(r: ReplicaView) -> tuple[object, ...]:
        # Not-yet-ready first, then stale, then the idlest: fewest in flight, then the longest since its last
        # request. A replica no router reported on is not the idlest (unknown is not idle): it goes after
        # those known. Then ours before adopted ones, then the newest.
        seen = idleness.get(r.id)
        inflight, last = seen if seen is not None else (0, None)
        return (
            r.effective_state() == "ready",
            not replica_stale(r, mp.entry),
            seen is None,
            inflight,
            last if last is not None else -math.inf,
            r.adopted,
            -r.created_at,
            r.id,
        )

    for r in sorted(mp.alive, key=order)[:extra]:
        mp.alive.remove(r)
        mp.actions.append(StopReplica(r.id, f"scale down to {target}{idle_words}", drain=True))
