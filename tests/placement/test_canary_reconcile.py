"""The reconciler under a canary: one new replica beside the stable ones, nothing stale stopped while it
runs; promoted, the roll goes on from it; failed, it is stopped and the stable replicas stay."""

from __future__ import annotations

from llmgw.core.fleet.views import ModelView
from llmgw.core.reconcile import CanaryPhase, RestartReplica, StartReplica, StopReplica, Wait, reconcile

from .builders import cpu_node, cpu_profile, entry
from .test_reconcile import FakeFleet, fleet

CANARY = {"strategy": "canary", "canary": {"weight": 10, "duration": "1m"}}


def canary_entry(cores: int) -> ModelView:
    return entry(cpu_profile(cores=cores), min=2, max=2, rollout=CANARY)


def step(f: FakeFleet, phase: CanaryPhase | None) -> list[object]:
    d = reconcile(
        f.models,
        f.nodes.values(),
        f.replicas.values(),
        now=f.now,
        rng=f.rng,
        canaries={} if phase is None else {"m": phase},
    )
    f.apply(d)
    return list(d.actions)


def changed_fleet() -> tuple[FakeFleet, set[str]]:
    f = fleet({"m": canary_entry(1)}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    f.step()
    f.ready_all()
    stable = set(f.replicas)
    f.models = {"m": canary_entry(2)}  # the change the canary gates
    return f, stable


def test_a_change_starts_one_canary_beside_the_stable_replicas_and_stops_nothing() -> None:
    f, stable = changed_fleet()
    actions = step(f, None)  # no run yet: a canary starting
    starts = [a for a in actions if isinstance(a, StartReplica)]
    assert len(starts) == 1 and starts[0].replaces in stable
    assert not [a for a in actions if isinstance(a, StopReplica | RestartReplica)]
    assert any(
        isinstance(a, Wait) and a.reason.startswith("canary: 1 new replica(s) beside 2 stable")
        for a in actions
    )
    f.ready_all()
    for _ in range(3):  # while it runs: the same three, no second canary, no scale-down
        actions = step(f, CanaryPhase("running", frozenset(set(f.replicas) - stable)))
        assert not [a for a in actions if isinstance(a, StartReplica | StopReplica | RestartReplica)]
    assert len(f.replicas) == 3 and stable < set(f.replicas)


def test_promoted_the_roll_goes_on_from_the_canary() -> None:
    f, stable = changed_fleet()
    step(f, None)
    f.ready_all()
    canary = set(f.replicas) - stable
    for _ in range(8):
        step(f, CanaryPhase("promoted", frozenset(canary)))
        f.ready_all()
    assert len(f.replicas) == 2 and not set(f.replicas) & stable and canary < set(f.replicas)


def test_failed_the_canary_is_drained_and_the_stable_replicas_are_held() -> None:
    f, stable = changed_fleet()
    step(f, None)
    f.ready_all()
    canary = frozenset(set(f.replicas) - stable)
    actions = step(f, CanaryPhase("failed", canary))
    stops = [a for a in actions if isinstance(a, StopReplica)]
    assert [(s.replica_id, s.drain, s.reason) for s in stops] == [
        (next(iter(canary)), True, "canary failed its gates: rolled back")
    ]
    for _ in range(3):
        actions = step(f, CanaryPhase("failed", canary))
        assert not [a for a in actions if isinstance(a, StartReplica | StopReplica | RestartReplica)]
    assert set(f.replicas) == stable


def test_a_plan_shows_the_whole_roll() -> None:
    f, stable = changed_fleet()
    d = reconcile(f.models, f.nodes.values(), f.replicas.values(), now=f.now, rng=f.rng, mode="plan")
    assert {a.replica_id for a in d.of(RestartReplica)} == stable
