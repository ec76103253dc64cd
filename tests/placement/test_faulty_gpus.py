"""Placement leaves a faulty GPU alone and says so; a replica already on one is not moved by it."""

from __future__ import annotations

from dataclasses import replace

from llmgw.core.placement import place

from .builders import entry, gpu_node, gpu_profile, replica
from .test_placement import only, reasons_for

ECC = "2 uncorrectable ECC error(s) since the driver loaded"


def _with_fault(node, index: int, fault: str = ECC):
    gpus = tuple(replace(g, fault=fault) if g.index == index else g for g in node.gpus)
    return replace(node, gpus=gpus)


def test_a_faulty_gpu_is_not_placed_on() -> None:
    models = {"m": entry(gpu_profile(gpus=1))}
    node = _with_fault(gpu_node("a", gpus=2), 0)
    placed = only(place(models, [node], []))
    assert [s.gpus for s in placed.shards] == [(1,)]


def test_the_reason_names_each_faulty_gpu_and_why() -> None:
    models = {"m": entry(gpu_profile(gpus=2))}
    node = _with_fault(gpu_node("a", gpus=2), 1)
    assert reasons_for("m", models, [node]) == {
        "a": f"has 1 free h100-80g, needs 2 (1 excluded as faulty: gpu 1: {ECC})"
    }
    assert place(models, [node], []).unplaced[0].missing == 1


def test_a_replica_already_on_a_faulty_gpu_is_kept() -> None:
    models = {"m": entry(gpu_profile(gpus=1))}
    node = _with_fault(gpu_node("a", gpus=2), 0)
    running = [replica("m-1", "m", "gpu", ("a", (0,)))]
    result = place(models, [node], running)
    assert not result.placements, "the running replica counts; nothing new is placed"
    assert not result.unplaced
