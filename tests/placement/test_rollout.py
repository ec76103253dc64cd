"""Rolling restarts in the reconciler: make-before-break within max_surge and max_unavailable, on a fake
fleet whose replicas become ready when the test says so; properties with hypothesis."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from llmgw.core.fleet.views import ModelView
from llmgw.core.reconcile import RestartReplica, RollPace, StartReplica, reconcile

from .builders import cpu_node, cpu_profile, entry
from .test_reconcile import FakeFleet, fleet


def rolled(view: ModelView, **rollout: object) -> ModelView:
    block = view.spec.rollout.model_copy(update=rollout)
    return view._replace(spec=view.spec.model_copy(update={"rollout": block}))


def ready_count(f: FakeFleet, model: str = "m") -> int:
    return sum(1 for r in f.of_model(model) if r.effective_state() == "ready")


def test_a_changed_profile_is_only_marked_by_default():
    f = fleet({"m": entry(cpu_profile(cores=2), min=2, max=2)}, cpu_node("a"), cpu_node("b"))
    f.step()
    f.ready_all()
    f.models = {"m": entry(cpu_profile(cores=3), min=2, max=2)}
    d = f.step()
    assert d.of(StartReplica) == [] and d.of(RestartReplica) == []
    assert all(r.stale for r in f.replicas.values())


def test_a_restart_asked_for_rolls_every_replica_at_the_pace_given():
    f = fleet({"m": entry(cpu_profile(cores=1), min=3, max=3)}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    f.step()
    f.ready_all()
    old = set(f.replicas)
    for rid in old:
        f.replicas[rid] = replace(f.replicas[rid], restart=True)
    # max_unavailable 1, max_surge 0: one old one stops first, its replacement starts in its place
    d = reconcile(
        f.models,
        f.nodes.values(),
        f.replicas.values(),
        now=f.now,
        rng=f.rng,
        paces={"m": RollPace(max_surge=0, max_unavailable=1)},
    )
    assert len(d.of(RestartReplica)) == 1 and len(d.of(StartReplica)) == 1
    assert d.of(StartReplica)[0].replaces == d.of(RestartReplica)[0].replica_id


@st.composite
def rolls(draw: st.DrawFn) -> tuple[int, int, int, list[bool]]:
    target = draw(st.integers(1, 4))
    surge = draw(st.integers(0, 2))
    unavailable = draw(st.integers(0 if surge else 1, 2))
    # Which replicas become ready after each step (a slow start, one at a time, or all together).
    readiness = draw(st.lists(st.booleans(), min_size=40, max_size=40))
    return target, surge, unavailable, readiness


@settings(max_examples=150, deadline=None)
@given(rolls())
def test_property_a_roll_keeps_within_its_pace_and_ends_with_every_replica_new(case) -> None:
    target, surge, unavailable, readiness = case
    nodes = [cpu_node(f"n{i}", cores=64) for i in range(4)]
    view = entry(cpu_profile(cores=1), min=target, max=target)
    f = fleet({"m": view}, *nodes)
    f.step()
    f.ready_all()
    f.models = {
        "m": rolled(
            entry(cpu_profile(cores=2), min=target, max=target),
            on_change="restart",
            max_surge=surge,
            max_unavailable=unavailable,
        )
    }
    new_fp = f.models["m"].fingerprints["cpu"]
    for ready_now in readiness:
        f.step()
        alive = [r for r in f.of_model("m")]
        assert len(alive) <= target + surge, "never more than target + max_surge replicas"
        assert ready_count(f) >= target - unavailable, "never more than max_unavailable ready ones missing"
        if ready_now:
            f.ready_all()
        if all(r.fingerprint == new_fp for r in f.of_model("m")) and ready_count(f) == target:
            break
    for _ in range(3 * target + 3):  # let it finish with every start made ready
        f.step()
        f.ready_all()
    assert sorted(r.fingerprint for r in f.of_model("m")) == [new_fp] * target
    assert f.step().actions == ()
