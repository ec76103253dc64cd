"""Property: whatever the fleet and the models, placement never hands out more than a node has."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings, strategies as st

from llmgw.core.fleet.views import GIB, GpuView, NodeView
from llmgw.core.placement import place

from .builders import cpu_profile, entry, gpu_profile, replica

CLASSES = ["h100-80g", "a100-40g"]
ENGINE_SETS = [
    {"vllm": "0.10.1", "llamacpp": "b1"},
    {"vllm": "0.10.1", "llamacpp": "b1"},
    {"vllm": "0.9.0"},
    {"vllm": None, "llamacpp": None},
    None,
]


@st.composite
def fleets(draw):
    n_nodes = draw(st.integers(1, 6))
    nodes = []
    for i in range(n_nodes):
        n_gpus = draw(st.integers(0, 8))
        cls = draw(st.sampled_from(CLASSES))
        allocated = draw(st.sets(st.integers(0, 7)))
        nodes.append(
            NodeView(
                name=f"n{i}",
                fabric=draw(st.sampled_from([None, "ib-a", "ib-b"])),
                cpu_cores=draw(st.one_of(st.none(), st.integers(0, 32))),
                memory_bytes=draw(st.one_of(st.none(), st.integers(0, 64).map(lambda g: g * GIB))),
                gpus=tuple(GpuView(j, cls, None, j in allocated) for j in range(n_gpus)),
                engines=draw(st.sampled_from(ENGINE_SETS)),
                state=draw(st.sampled_from(["Ready", "Ready", "Ready", "Unreachable", "Lost"])),
                cordoned=draw(st.booleans()) and draw(st.booleans()),
                labels=draw(st.sampled_from([{}, {"ram": "32g"}])),
            )
        )
    models = {}
    for i in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            prof = gpu_profile(
                gpus=draw(st.integers(1, 8)),
                gpu_class=draw(st.sampled_from(CLASSES)),
                nodes=draw(st.integers(1, 2)),
                cpu_cores=draw(st.one_of(st.none(), st.integers(1, 8))),
                min_memory_gb=draw(st.one_of(st.none(), st.integers(1, 32))),
                engine_version=draw(st.sampled_from([None, "0.10"])),
            )
        else:
            prof = cpu_profile(
                cores=draw(st.integers(1, 16)),
                memory_gb=draw(st.integers(1, 32)),
                node_selector=draw(st.sampled_from([{}, {"ram": "32g"}])),
            )
        n = draw(st.integers(1, 4))
        models[f"m{i}"] = entry(prof, min=n, max=n)
    return nodes, models


@settings(max_examples=100, deadline=None)
@given(fleets())
def test_never_over_allocates(fleet):
    nodes, models = fleet
    existing = []
    # place twice: the second pass must respect what the first one placed
    first = place(models, nodes, [])
    for p in first.placements:
        existing.append(replica(p.replica_id, p.model, p.profile, *[(s.node, s.gpus) for s in p.shards]))
    bigger = {
        m: e._replace(
            spec=e.spec.model_copy(
                update={
                    "scaling": e.spec.scaling.model_copy(
                        update={"min": e.spec.scaling.min * 2, "max": e.spec.scaling.min * 2}
                    )
                }
            )
        )
        for m, e in models.items()
    }
    second = place(bigger, nodes, existing)
    by_node = {n.name: n for n in nodes}
    gpus_used: dict[str, list[int]] = defaultdict(list)
    cores: dict[str, int] = defaultdict(int)
    memory: dict[str, float] = defaultdict(float)
    for p in first.placements + second.placements:
        profile = next(pr for pr in models[p.model].spec.profiles if pr.name == p.profile)
        assert len(p.shards) == profile.nodes
        assert len({s.node for s in p.shards}) == profile.nodes
        if profile.nodes > 1:
            fabrics = {by_node[s.node].fabric for s in p.shards}
            assert len(fabrics) == 1 and None not in fabrics
        for s in p.shards:
            node = by_node[s.node]
            assert node.state == "Ready"
            gpus_used[s.node].extend(s.gpus)
            assert len(s.gpus) == profile.gpus
            for idx in s.gpus:
                gpu = next(g for g in node.gpus or () if g.index == idx)
                assert not gpu.allocated and gpu.gpu_class == profile.gpu_class
            cores[s.node] += profile.cpu_cores or 0
            memory[s.node] += (profile.min_memory_gb or 0) * GIB
    for name, used in gpus_used.items():
        assert len(used) == len(set(used)), f"{name}: a GPU handed out twice"
    for name, node in by_node.items():
        if node.cpu_cores is not None:
            assert cores[name] <= node.cpu_cores
        if node.memory_bytes is not None:
            assert memory[name] <= node.memory_bytes


@settings(max_examples=100, deadline=None)
@given(fleets(), st.data())
def test_fast_filters_and_words_agree(fleet, data):
    """The placement pass uses the cheap filters; explain uses the worded ones. They must never disagree."""
    from llmgw.core.placement.rooms import build_rooms, dynamic_fits, static_fits, verdict

    nodes, models = fleet
    rooms = build_rooms(nodes, [], models)
    for view in models.values():
        for profile in view.spec.profiles:
            for room in rooms.values():
                fast = static_fits(room.node, profile) and dynamic_fits(room, profile, None)
                assert fast == verdict(room, profile, None).accepted


@settings(max_examples=100, deadline=None)
@given(fleets())
def test_bucketed_bin_pack_chooses_as_the_plain_search_does(fleet):
    from llmgw.core.placement import Placer

    nodes, models = fleet
    fast, plain = Placer(models, nodes, []), Placer(models, nodes, [])
    plain.use_buckets = False
    for _round in range(3):
        for name in sorted(models):
            assert fast.place_one(name) == plain.place_one(name)
