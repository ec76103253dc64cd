"""Placement: every rejection reason in words, bin-pack vs spread, unknown fields, multi-node fabrics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.core.config.models import Source
from llmgw.core.fleet.views import NodeView, weights_key
from llmgw.core.placement import Placement, explain, place
from llmgw.core.placement.rooms import build_rooms, dynamic_fits, static_fits, verdict

from .builders import cpu_node, cpu_profile, entry, gpu_node, gpu_profile, replica


def reasons_for(model: str, models, nodes, replicas=(), profile: str | None = None) -> dict[str, str]:
    exp = explain(model, models, nodes, replicas)
    prof = exp.profiles[0] if profile is None else next(p for p in exp.profiles if p.profile == profile)
    return {v.node: v.words() for v in prof.verdicts}


def only(result) -> Placement:
    assert len(result.placements) == 1, result
    return result.placements[0]


# ---------------------------------------------------------------------------------------------- reasons


def test_gpu_free_count_reason():
    models = {"m": entry(gpu_profile(gpus=4))}
    nodes = [gpu_node("a", allocated=(0, 1, 2, 3, 4, 5))]
    assert reasons_for("m", models, nodes) == {"a": "has 2 free h100-80g, needs 4"}
    assert place(models, nodes, []).unplaced[0].missing == 1


def test_gpu_held_by_a_replica_is_not_free():
    models = {"m": entry(gpu_profile(gpus=4)), "other": entry(gpu_profile(gpus=6), min=0)}
    nodes = [gpu_node("a")]
    held = [replica("o-1", "other", "gpu", ("a", (0, 1, 2, 3, 4, 5)))]
    assert reasons_for("m", models, nodes, held) == {"a": "has 2 free h100-80g, needs 4"}


def test_gpu_class_reason():
    models = {"m": entry(gpu_profile(gpus=1, gpu_class="h100-80g"))}
    nodes = [gpu_node("a", gpu_class="a100-40g"), cpu_node("c", engines={"vllm": "0.10.1"})]
    assert reasons_for("m", models, nodes) == {
        "a": "has no h100-80g, needs 1",
        "c": "has no h100-80g, needs 1",
    }


def test_gpus_not_reported_cannot_take_a_gpu_replica():
    models = {"m": entry(gpu_profile(gpus=1))}
    nodes = [gpu_node("a").__class__(name="a", engines={"vllm": "0.10.1"})]
    assert reasons_for("m", models, nodes) == {"a": "GPUs not reported, needs 1 h100-80g"}


def test_memory_reason():
    models = {"m": entry(cpu_profile(memory_gb=24))}
    nodes = [cpu_node("small", memory_gb=8)]
    assert reasons_for("m", models, nodes) == {"small": "has 8 GB of memory, needs 24"}


def test_memory_reason_counts_what_replicas_hold():
    models = {"m": entry(cpu_profile(memory_gb=24, cores=1), min=2, max=2)}
    nodes = [cpu_node("n", memory_gb=32)]
    held = [replica("m-cpu-1", "m", "cpu", ("n", ()))]
    assert reasons_for("m", models, nodes, held) == {"n": "has 8 GB of memory free (of 32), needs 24"}


def test_cpu_cores_reason():
    models = {"m": entry(cpu_profile(cores=8))}
    nodes = [cpu_node("n", cores=4)]
    assert reasons_for("m", models, nodes) == {"n": "has 4 CPU cores, needs 8"}


def test_disk_reason_and_skipped_where_weights_are():
    source = Source(url="http://mirror/m.gguf")
    models = {"m": entry(cpu_profile(disk_gb=40), source=source.model_dump(exclude_none=True))}
    key = weights_key(source)
    assert key is not None
    nodes = [
        cpu_node("empty", disk_free_bytes=10 * 1024**3, weights=frozenset()),
        cpu_node("holder", disk_free_bytes=10 * 1024**3, weights=frozenset({key})),
    ]
    assert reasons_for("m", models, nodes) == {
        "empty": "has 10 GB of disk free, needs 40",
        "holder": "fits (weights already here, disk not checked)",
    }
    assert only(place(models, nodes, [])).nodes == ("holder",)


def test_label_reason():
    models = {"m": entry(cpu_profile(node_selector={"ram": "32g"}))}
    nodes = [cpu_node("n", labels={"ram": "16g"}), cpu_node("bare")]
    assert reasons_for("m", models, nodes) == {
        "bare": "does not carry ram=32g",
        "n": "does not carry ram=32g",
    }


def test_engine_missing_reason():
    models = {"m": entry(cpu_profile())}
    nodes = [cpu_node("n", engines={"vllm": "0.10.1"})]
    assert reasons_for("m", models, nodes) == {"n": "no llamacpp installed"}


def test_engine_version_reason_and_prefix_match():
    models = {"m": entry(gpu_profile(gpus=1, engine_version="0.10.1"))}
    nodes = [gpu_node("old", engines={"vllm": "0.9.0"}), gpu_node("new", engines={"vllm": "0.10.1"})]
    assert reasons_for("m", models, nodes) == {"new": "fits", "old": "has vllm 0.9.0, needs 0.10.1"}
    prefix = {"m": entry(gpu_profile(gpus=1, engine_version="0.10"))}
    assert reasons_for("m", prefix, [gpu_node("n", engines={"vllm": "0.10.1"})]) == {"n": "fits"}
    assert reasons_for("m", prefix, [gpu_node("n", engines={"vllm": "0.100.1"})]) == {
        "n": "has vllm 0.100.1, needs 0.10"
    }


@pytest.mark.parametrize("state", ["Unreachable", "Lost"])
def test_node_state_reason(state):
    models = {"m": entry(cpu_profile())}
    nodes = [cpu_node("n", state=state)]
    assert reasons_for("m", models, nodes) == {"n": f"node is {state}"}
    assert place(models, nodes, []).placements == ()


def test_cordoned_reason():
    models = {"m": entry(cpu_profile())}
    assert reasons_for("m", models, [cpu_node("n", cordoned=True)]) == {"n": "cordoned"}


def test_every_reason_is_given_not_only_the_first():
    models = {"m": entry(cpu_profile(cores=8, memory_gb=24, node_selector={"ram": "32g"}))}
    nodes = [cpu_node("n", cores=2, memory_gb=8, cordoned=True)]
    assert reasons_for("m", models, nodes) == {
        "n": "cordoned; does not carry ram=32g; has 8 GB of memory, needs 24; has 2 CPU cores, needs 8"
    }


# ---------------------------------------------------------------------------------------------- unknown


def test_unknown_memory_cores_disk_engines_are_accepted_and_said():
    models = {"m": entry(cpu_profile(cores=4, memory_gb=24, disk_gb=10))}
    nodes = [cpu_node("old-agent", cores=None, memory_gb=None, disk_free_bytes=None, engines=None)]
    assert reasons_for("m", models, nodes) == {
        "old-agent": "fits (engines not reported; memory not reported; CPU cores not reported; disk not reported)"
    }
    assert only(place(models, nodes, [])).nodes == ("old-agent",)


def test_unknown_engine_version_is_accepted():
    models = {"m": entry(gpu_profile(gpus=1, engine_version="0.10.1"))}
    nodes = [gpu_node("n", engines={"vllm": None})]
    assert reasons_for("m", models, nodes) == {"n": "fits (vllm version not reported)"}


def test_sim_needs_no_installed_engine():
    models = {"s": entry(cpu_profile(engine="sim", cores=1, memory_gb=None))}
    assert reasons_for("s", models, [cpu_node("n", engines={})]) == {"n": "fits"}


# ---------------------------------------------------------------------------------------------- choosing


def test_gpu_replicas_bin_pack():
    models = {"m": entry(gpu_profile(gpus=2))}
    nodes = [
        gpu_node("empty"),
        gpu_node("half", allocated=(0, 1, 2, 3)),
        gpu_node("full", allocated=tuple(range(7))),
    ]
    chosen = only(place(models, nodes, []))
    assert chosen.nodes == ("half",)
    assert chosen.shards[0].gpus == (4, 5)
    assert "bin-pack" in chosen.why


def test_cpu_replicas_spread():
    models = {"m": entry(cpu_profile(cores=2, memory_gb=1), min=3, max=3)}
    nodes = [cpu_node("a", cores=8), cpu_node("b", cores=16), cpu_node("c", cores=4)]
    placed = place(models, nodes, []).placements
    assert [p.nodes[0] for p in placed] == ["b", "a", "c"]
    assert "spread" in placed[0].why


def test_a_models_replicas_go_to_different_nodes_where_possible():
    models = {"m": entry(gpu_profile(gpus=2), min=2, max=2)}
    nodes = [gpu_node("a"), gpu_node("b")]
    placed = place(models, nodes, []).placements
    assert sorted(p.nodes[0] for p in placed) == ["a", "b"]
    # with one node only, both land on it
    placed = place(models, [gpu_node("a")], []).placements
    assert [p.nodes[0] for p in placed] == ["a", "a"]
    assert placed[0].shards[0].gpus != placed[1].shards[0].gpus


def test_profiles_tried_in_preference_order():
    models = {"m": entry(gpu_profile("big", gpus=8), gpu_profile("small", gpus=2))}
    nodes = [gpu_node("a", allocated=(0, 1, 2))]
    chosen = only(place(models, nodes, []))
    assert chosen.profile == "small"
    assert chosen.fingerprint == models["m"].fingerprints["small"]


def test_existing_replicas_count_toward_min():
    models = {"m": entry(cpu_profile(), min=2, max=2)}
    nodes = [cpu_node("a"), cpu_node("b")]
    existing = [replica("m-cpu-1", "m", "cpu", ("a", ()))]
    chosen = only(place(models, nodes, existing))
    assert chosen.nodes == ("b",)
    assert chosen.replica_id == "m-cpu-2"


def test_placement_is_deterministic():
    models = {f"m{i}": entry(gpu_profile(gpus=1 + i % 4), min=1 + i % 2, max=2) for i in range(20)}
    nodes = [gpu_node(f"n{i}", allocated=tuple(range(i % 5))) for i in range(10)]
    first = place(models, nodes, [])
    second = place(dict(reversed(list(models.items()))), list(reversed(nodes)), [])
    assert first == second


# ---------------------------------------------------------------------------------------------- multi-node


def test_multi_node_needs_nodes_of_one_fabric():
    models = {"m": entry(gpu_profile(gpus=8, nodes=2))}
    nodes = [
        gpu_node("a1", fabric="ib-a"),
        gpu_node("b1", fabric="ib-b"),
        gpu_node("b2", fabric="ib-b"),
        gpu_node("x", fabric=None),
    ]
    chosen = only(place(models, nodes, []))
    assert chosen.nodes == ("b1", "b2")
    assert [s.rank for s in chosen.shards] == [0, 1]
    assert [s.rank for s in chosen.start_order()] == [1, 0]
    assert chosen.shards[0].gpus == tuple(range(8))


def test_multi_node_split_across_fabrics_cannot_be_placed():
    models = {"m": entry(gpu_profile(gpus=8, nodes=2))}
    nodes = [gpu_node("a1", fabric="ib-a"), gpu_node("b1", fabric="ib-b"), gpu_node("x")]
    result = place(models, nodes, [])
    assert result.placements == ()
    exp = result.unplaced[0].explanation
    assert exp.profiles[0].summary == "needs 2 nodes of one fabric that fit: ib-a has 1, ib-b has 1"
    assert exp.rejections()["gpu"] == {"x": "no fabric declared, a 2-node replica needs one"}


def test_explain_names_the_chosen_node_and_unknown_model():
    models = {"m": entry(cpu_profile())}
    exp = explain("m", models, [cpu_node("a")], [])
    assert exp.chosen is not None and exp.chosen.nodes == ("a",)
    assert explain("nope", models, [cpu_node("a")], []).problem == "not in the catalog"


def test_fast_filters_agree_with_the_words():
    """`fits` (the fast path) and `verdict` (the words) must give the same answer on every case above."""
    profiles = [
        gpu_profile(gpus=4),
        gpu_profile(gpus=1, engine_version="0.10"),
        cpu_profile(cores=8, memory_gb=24, disk_gb=100, node_selector={"ram": "32g"}),
        cpu_profile(engine="sim"),
    ]
    nodes: list[NodeView] = [
        gpu_node("g1", allocated=(0, 1, 2, 3, 4)),
        gpu_node("g2", engines={"vllm": "0.9"}),
        cpu_node("c1", cores=4, memory_gb=8),
        cpu_node("c2", labels={"ram": "32g"}, cores=None, memory_gb=None, disk_free_bytes=None),
        replace(cpu_node("c3"), state="Unreachable"),
        cpu_node("c4", engines=None, cordoned=True),
    ]
    rooms = build_rooms(nodes, [], {})
    for profile in profiles:
        for room in rooms.values():
            fast = static_fits(room.node, profile) and dynamic_fits(room, profile, None)
            assert fast == verdict(room, profile, None).accepted, (profile.name, room.name)


def test_bucketed_search_prefers_an_emptier_node_without_the_model():
    """The fullest bucket holds a node with this model already; a node further up without it wins."""
    models = {"m": entry(gpu_profile(gpus=2), min=3, max=3)}
    nodes = [gpu_node("a"), gpu_node("b", allocated=(0,)), gpu_node("c", allocated=(0, 1, 2))]
    placed = [p.nodes[0] for p in place(models, nodes, []).placements]
    assert placed == ["c", "b", "a"]
