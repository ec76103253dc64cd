"""Capacity classes and preemption: the pure choice (llmgw.core.placement.preempt) and the reconciler that
acts on it, on a fake fleet; properties with hypothesis."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from llmgw.core.fleet.views import ModelView, ReplicaView
from llmgw.core.placement import Placer, find_preemption
from llmgw.core.placement.rooms import fit_check
from llmgw.core.reconcile import StartReplica, StopReplica, Wait

from .builders import cpu_node, cpu_profile, entry, gpu_node, gpu_profile, replica
from .test_reconcile import fleet

CLASSES = ["critical", "interactive", "batch"]


def ranked(view: ModelView, cls: str) -> ModelView:
    return view._replace(spec=view.spec.model_copy(update={"model_class": cls}), rank=CLASSES.index(cls))


def full_of_batch() -> tuple[dict[str, ModelView], list[ReplicaView]]:
    """Two 8-GPU nodes, each holding two 4-GPU batch replicas."""
    models = {
        "batch": ranked(entry(gpu_profile(gpus=4), min=4, max=4), "batch"),
        "chat": ranked(entry(gpu_profile(gpus=4), min=1), "critical"),
    }
    replicas = [
        replica(f"batch-{i}", "batch", "gpu", (node, gpus))
        for i, (node, gpus) in enumerate(
            [("g1", (0, 1, 2, 3)), ("g1", (4, 5, 6, 7)), ("g2", (0, 1, 2, 3)), ("g2", (4, 5, 6, 7))]
        )
    ]
    return models, replicas


def test_a_critical_model_on_a_fleet_full_of_batch_replicas_takes_one_replicas_room():
    models, replicas = full_of_batch()
    f = fleet(models, gpu_node("g1"), gpu_node("g2"))
    f.replicas = {r.id: r for r in replicas}
    d = f.decide()
    stops = d.of(StopReplica)
    assert [(s.replica_id, s.preempted_by, s.drain) for s in stops] == [("batch-0", "chat", True)]
    assert "batch-0 of batch (batch) yields g1 to chat (critical)" in stops[0].reason
    assert d.of(StartReplica) == []  # its GPUs are not free until it is gone
    assert any(isinstance(a, Wait) and "waiting for batch-0 to stop" in a.reason for a in d.actions)
    assert "chat" not in d.unplaced

    # While it drains, it is counted as room: no second victim on the next pass.
    f.replicas["batch-0"] = replace(f.replicas["batch-0"], state="draining")
    d = f.decide()
    assert d.of(StopReplica) == [] and d.of(StartReplica) == []
    # Once it is gone, chat is placed there first, before batch's own replacement (a lower class).
    del f.replicas["batch-0"]
    d = f.decide()
    (start,) = d.of(StartReplica)
    assert start.placement.model == "chat" and start.placement.nodes == ("g1",)
    assert d.unplaced == {"batch": 1}


def test_never_an_equal_or_higher_class():
    models, replicas = full_of_batch()
    models["chat"] = ranked(models["chat"], "batch")
    f = fleet(models, gpu_node("g1"), gpu_node("g2"))
    f.replicas = {r.id: r for r in replicas}
    d = f.decide()
    assert d.of(StopReplica) == []
    assert d.unplaced == {"chat": 1}


def test_without_classes_nothing_is_preempted():
    models, replicas = full_of_batch()
    models = {name: view._replace(rank=0) for name, view in models.items()}
    f = fleet(models, gpu_node("g1"), gpu_node("g2"))
    f.replicas = {r.id: r for r in replicas}
    assert f.decide().of(StopReplica) == []


def test_the_fewest_victims_of_the_lowest_class_and_no_more_than_the_need():
    # g1: one 8-GPU interactive replica; g2: two 4-GPU batch replicas. An 8-GPU critical replica needs a
    # whole node: one victim (the interactive one) is fewer than two batch ones.
    models = {
        "big": ranked(entry(gpu_profile(gpus=8), min=1), "interactive"),
        "batch": ranked(entry(gpu_profile(gpus=4), min=2, max=2), "batch"),
        "chat": ranked(entry(gpu_profile(gpus=8), min=1), "critical"),
        "small": ranked(entry(gpu_profile(gpus=4), min=1), "interactive"),
    }
    replicas = [
        replica("big-1", "big", "gpu", ("g1", tuple(range(8)))),
        replica("batch-1", "batch", "gpu", ("g2", (0, 1, 2, 3))),
        replica("batch-2", "batch", "gpu", ("g2", (4, 5, 6, 7))),
    ]
    f = fleet(models, gpu_node("g1"), gpu_node("g2"))
    f.replicas = {r.id: r for r in replicas}
    d = f.decide()
    assert [s.replica_id for s in d.of(StopReplica) if s.preempted_by == "chat"] == ["big-1"]
    # small (interactive) ranks above batch: one batch replica yields to it, not both
    assert [s.replica_id for s in d.of(StopReplica) if s.preempted_by == "small"] == ["batch-1"]


def test_a_lower_class_never_preempts_and_cpu_cores_are_room_too():
    models = {
        "batch": ranked(entry(cpu_profile(cores=2, memory_gb=None), min=2, max=2), "batch"),
        "chat": ranked(entry(cpu_profile(cores=2, memory_gb=None), min=1), "critical"),
    }
    replicas = [replica(f"b-{i}", "batch", "cpu", ("n1", ()), created_at=float(i)) for i in (1, 2)]
    f = fleet(models, cpu_node("n1", cores=4, memory_gb=None))
    f.replicas = {r.id: r for r in replicas}
    d = f.decide()
    assert [s.replica_id for s in d.of(StopReplica)] == ["b-2"]  # the newer of two equals


# ------------------------------------------------------------------------------------------ properties

_MODELS = ["m0", "m1", "m2", "m3"]


@st.composite
def fleets(draw: st.DrawFn) -> tuple[dict[str, ModelView], list[ReplicaView], str, int]:
    """CPU nodes of 8 cores, models of random class and size, the nodes filled with random replicas."""
    models: dict[str, ModelView] = {}
    for name in _MODELS:
        cores = draw(st.sampled_from([1, 2, 3, 4]))
        cls = draw(st.sampled_from(CLASSES))
        models[name] = ranked(entry(cpu_profile(cores=cores, memory_gb=None), min=1, max=8), cls)
    nodes = draw(st.integers(1, 3))
    replicas: list[ReplicaView] = []
    for n in range(nodes):
        free = 8
        for i in range(draw(st.integers(0, 6))):
            model = draw(st.sampled_from(_MODELS))
            need = models[model].spec.profiles[0].cpu_cores or 0
            if need > free:
                break
            free -= need
            state = draw(st.sampled_from(["ready", "ready", "starting", "draining"]))
            replicas.append(replica(f"r{n}-{i}", model, "cpu", (f"n{n}", ()), state=state))
    needy = draw(st.sampled_from(_MODELS))
    return models, replicas, needy, nodes


def _nodes(count: int) -> list:
    return [cpu_node(f"n{i}", cores=8, memory_gb=None) for i in range(count)]


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_property_never_preempts_an_equal_or_higher_class_and_frees_no_more_than_needed(case) -> None:
    models, replicas, needy, count = case
    nodes = _nodes(count)
    found = find_preemption(Placer(models, nodes, replicas), needy, replicas, frozenset())
    if found is None:
        return
    choice, _room = found
    by_id = {r.id: r for r in replicas}
    rank = models[needy].rank
    for victim in choice.victims:
        assert models[by_id[victim].model].rank > rank, "never a replica of the same or a higher class"
        assert by_id[victim].state not in ("draining", "stopping")
    gone = set(choice.victims) | set(choice.yielding)
    profile = models[needy].spec.profiles[0]

    def fits_without(ids: set[str]) -> bool:
        rest = [r for r in replicas if r.id not in ids]
        room = Placer(models, nodes, rest).rooms[choice.node]
        return fit_check(profile, None)(room)

    assert fits_without(gone), "the victims make the room"
    for victim in choice.victims:
        assert not fits_without(gone - {victim}), f"{victim} was not needed"


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_property_a_pass_preempts_only_for_what_is_missing(case) -> None:
    models, replicas, _needy, count = case
    f = fleet(models, *_nodes(count))
    f.replicas = {r.id: r for r in replicas}
    d = f.decide()
    by_id = {r.id: r for r in replicas}
    missing = {
        m: max(0, 1 - sum(1 for r in replicas if r.model == m and r.state != "draining")) for m in models
    }
    chosen = [s.replica_id for s in d.of(StopReplica) if s.preempted_by is not None]
    assert len(set(chosen)) == len(chosen), "no replica yields twice"
    for model in models:
        victims = [s for s in d.of(StopReplica) if s.preempted_by == model]
        for s in victims:
            assert models[by_id[s.replica_id].model].rank > models[model].rank
        if missing[model] == 0:
            assert victims == [], "a model at its need preempts nothing"
