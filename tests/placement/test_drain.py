"""A drained node (`llmgw node drain`) in the reconciler: its replicas are replaced elsewhere before they stop,
and one nothing can replace keeps serving there instead of taking its model down."""

from __future__ import annotations

from dataclasses import replace

from llmgw.core.reconcile import StartReplica, StopReplica, Wait

from .builders import cpu_node, cpu_profile, entry
from .test_reconcile import fleet


def test_a_drained_nodes_replica_moves_make_before_break():
    f = fleet({"m": entry(cpu_profile(cores=2), min=1)}, cpu_node("a"), cpu_node("b"))
    f.nodes["b"] = replace(f.nodes["b"], cordoned=True)
    f.step()
    f.ready_all()
    [old] = f.replicas
    f.nodes["b"] = replace(f.nodes["b"], cordoned=False)
    f.nodes["a"] = replace(f.nodes["a"], cordoned=True, drained=True)
    d = f.step()
    (start,) = d.of(StartReplica)
    assert start.placement.nodes == ("b",) and start.replaces == old
    assert start.reason == f"replaces {old} (node a drained)"
    assert d.of(StopReplica) == []  # it serves until its replacement is ready
    f.ready_all()
    d = f.step()
    assert [(s.replica_id, s.drain) for s in d.of(StopReplica)] == [(old, True)]
    assert "node a drained; 1 ready replica(s) elsewhere" in d.of(StopReplica)[0].reason


def test_a_drained_nodes_replica_nothing_can_replace_keeps_serving():
    f = fleet({"m": entry(cpu_profile(cores=2), min=1)}, cpu_node("a"))
    f.step()
    f.ready_all()
    [old] = f.replicas
    f.nodes["a"] = replace(f.nodes["a"], cordoned=True, drained=True)
    d = f.step()
    assert d.of(StopReplica) == [] and d.of(StartReplica) == []
    words = [a.reason for a in d.of(Wait)]
    assert any(f"{old} on drained node a keeps serving" in w for w in words), words


def test_a_removed_node_still_lets_go_when_nothing_can_replace():
    f = fleet({"m": entry(cpu_profile(cores=2), min=1)}, cpu_node("a"))
    f.step()
    f.ready_all()
    f.nodes["a"] = replace(f.nodes["a"], cordoned=True, leaving=True)
    assert len(f.step().of(StopReplica)) == 1
