"""Facilities in placement, as properties over generated fleets: replicas spread across racks and PDUs, a
multi-node replica kept within one domain, nothing placed in a held domain, no domain taken past its power cap.
The expectations are worked out here from the nodes' labels, independently of placement's own books."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from llmgw.core.fleet.views import GpuView, NodeView
from llmgw.core.placement import Placer, explain, place
from llmgw.core.placement.facility import hold_words, node_power_caps

from .builders import entry, gpu_profile, replica

RACKS = ["r1", "r2", "r3"]
PDUS = ["p1", "p2"]


def _labels(rack: str | None, pdu: str | None) -> dict[str, str]:
    out = {"llmgw.io/site": "s1"}
    if rack is not None:
        out["llmgw.io/rack"] = rack
    if pdu is not None:
        out["llmgw.io/pdu"] = pdu
    return out


def _node(
    name: str, labels: dict[str, str], gpus: int = 8, watts: float | None = None, **kw: object
) -> NodeView:
    return NodeView(
        name=name,
        labels=labels,
        gpus=tuple(GpuView(i, "h100-80g", None, watts=watts) for i in range(gpus)),
        engines={"vllm": "0.10.1"},
        **kw,  # type: ignore[arg-type]
    )


@st.composite
def racked_fleets(draw: st.DrawFn) -> list[NodeView]:
    nodes = []
    for i in range(draw(st.integers(2, 8))):
        rack = draw(st.sampled_from(RACKS))
        pdu = draw(st.sampled_from(PDUS))
        nodes.append(
            _node(
                f"n{i}",
                _labels(rack, pdu),
                gpus=draw(st.integers(1, 4)),
                fabric=draw(st.sampled_from(["ib-a", "ib-b"])),
            )
        )
    return nodes


def _rack(node: NodeView) -> str | None:
    return node.labels.get("llmgw.io/rack")


# ---------------------------------------------------------------------------------------------- spread


@settings(max_examples=60, deadline=None)
@given(racked_fleets(), st.integers(1, 10))
def test_a_replica_goes_to_a_crowded_rack_only_when_no_emptier_rack_fits(
    nodes: list[NodeView], wanted: int
) -> None:
    models = {"m": entry(gpu_profile(gpus=1), min=wanted, max=wanted)}
    by_name = {n.name: n for n in nodes}
    placer = Placer(models, nodes, [])
    per_rack: Counter[str | None] = Counter()
    per_node: Counter[str] = Counter()
    for _ in range(wanted):
        # Before placing: where could it go, and how crowded is each of those racks (counted here).
        fitting = [n for n in nodes if placer.rooms[n.name].free_gpu_count("h100-80g") >= 1]
        p = placer.place_one("m")
        if p is None:
            assert not fitting
            break
        chosen = by_name[p.nodes[0]]
        least = min((per_node[n.name], per_rack[_rack(n)]) for n in fitting)
        assert (per_node[chosen.name], per_rack[_rack(chosen)]) == least
        if per_rack[_rack(chosen)]:
            assert "spread yields: rack" in p.why
        per_rack[_rack(chosen)] += 1
        per_node[chosen.name] += 1


def test_spread_counts_replicas_already_running_and_says_when_it_yields() -> None:
    nodes = [
        _node("a1", _labels("r1", "p1")),
        _node("a2", _labels("r1", "p1")),
        _node("b1", _labels("r2", "p2"), gpus=1),
    ]
    models = {"m": entry(gpu_profile(gpus=1), min=3, max=3)}
    running = [replica("m-1", "m", "gpu", ("a1", (0,)))]
    placed = place(models, nodes, running, wanted={"m": 2}).placements
    # r2 holds none: the first goes there although bin-packing would prefer a1's fuller node; then only r1 fits.
    assert [p.nodes for p in placed] == [("b1",), ("a2",)]
    assert "spread yields" not in placed[0].why
    assert "spread yields: rack r1 holds 1 already, pdu p1 holds 1 already" in placed[1].why


# ---------------------------------------------------------------------------------------------- keep_within


@settings(max_examples=60, deadline=None)
@given(racked_fleets(), st.sampled_from(["rack", "pdu"]), st.integers(1, 3))
def test_a_multi_node_replica_stays_within_one_domain(nodes: list[NodeView], level: str, wanted: int) -> None:
    profile = gpu_profile(gpus=1, nodes=2, keep_within=level)
    models = {"m": entry(profile, min=wanted, max=wanted)}
    by_name = {n.name: n for n in nodes}
    result = place(models, nodes, [])
    for p in result.placements:
        shards = [by_name[n] for n in p.nodes]
        assert len({n.labels[f"llmgw.io/{level}"] for n in shards}) == 1
        assert len({n.fabric for n in shards}) == 1
    if not result.placements:  # then no fabric and domain holds two nodes with a free card
        groups = Counter((n.fabric, n.labels[f"llmgw.io/{level}"]) for n in nodes)
        assert max(groups.values()) < 2


def test_keep_within_refuses_a_node_that_does_not_say_where_it_stands() -> None:
    nodes = [_node("a", _labels("r1", "p1"), fabric="ib"), _node("b", _labels(None, "p1"), fabric="ib")]
    models = {"m": entry(gpu_profile(gpus=1, nodes=2, keep_within="rack"))}
    exp = explain("m", models, nodes, [])
    assert exp.chosen is None
    assert (
        exp.rejections()["gpu"]["b"]
        == "no llmgw.io/rack label: keep_within rack needs to know where it stands"
    )
    assert exp.profiles[0].summary == "needs 2 nodes of one fabric and one rack that fit: ib rack r1 has 1"
    # Without keep_within the same two nodes make a replica.
    models = {"m": entry(gpu_profile(gpus=1, nodes=2))}
    assert place(models, nodes, []).placements[0].nodes == ("a", "b")


# ---------------------------------------------------------------------------------------------- holds


@settings(max_examples=60, deadline=None)
@given(
    racked_fleets(),
    st.sets(st.sampled_from([f"rack={r}" for r in RACKS] + [f"pdu={p}" for p in PDUS]), max_size=3),
)
def test_nothing_is_placed_in_a_held_domain(nodes: list[NodeView], holds: set[str]) -> None:
    held = {ref: "by ann" for ref in holds}
    nodes = [NodeView(**{**_fields(n), "held": hold_words(n.labels, held)}) for n in nodes]
    models = {"m": entry(gpu_profile(gpus=1), min=6, max=6)}
    result = place(models, nodes, [])
    by_name = {n.name: n for n in nodes}
    for p in result.placements:
        node = by_name[p.nodes[0]]
        assert not {f"rack={_rack(node)}", f"pdu={node.labels['llmgw.io/pdu']}"} & holds
    free = [n for n in nodes if not n.held]
    assert len(result.placements) == min(6, sum(len(n.gpus or ()) for n in free))
    if result.unplaced:
        words = result.unplaced[0].explanation.rejections()["gpu"]
        for n in nodes:
            if n.held:
                assert n.held in words[n.name] and words[n.name].startswith("facility hold: ")


def _fields(n: NodeView) -> dict[str, object]:
    return {f: getattr(n, f) for f in n.__dataclass_fields__}


# ---------------------------------------------------------------------------------------------- power


@st.composite
def powered_fleets(draw: st.DrawFn) -> tuple[list[NodeView], dict[str, float]]:
    caps = {f"pdu={p}": float(draw(st.integers(1, 12)) * 500) for p in PDUS}
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        pdu = draw(st.sampled_from(PDUS))
        labels = _labels(draw(st.sampled_from(RACKS)), pdu)
        nodes.append(
            _node(
                f"n{i}",
                labels,
                gpus=draw(st.integers(1, 4)),
                watts=700.0,
                power_watts=draw(st.one_of(st.none(), st.sampled_from([300.0, 900.0]))),
                power_draw_watts=draw(st.one_of(st.none(), st.sampled_from([200.0, 1500.0, 4000.0]))),
                power_caps=node_power_caps(labels, caps),
            )
        )
    return nodes, caps


def _draw(nodes: list[NodeView], busy: Counter[str], pdu: str) -> float:
    """A PDU's draw as docs/placement.md says: per node, the larger of measured and declared+busy cards."""
    total = 0.0
    for n in nodes:
        if n.labels["llmgw.io/pdu"] == pdu:
            declared = (n.power_watts or 0.0) + 700.0 * busy[n.name]
            total += max(declared, n.power_draw_watts or 0.0)
    return total


@settings(max_examples=80, deadline=None)
@given(powered_fleets(), st.integers(1, 8), st.integers(1, 2))
def test_no_shard_takes_a_domain_past_its_power_cap(
    fleet: tuple[list[NodeView], dict[str, float]], wanted: int, gpus: int
) -> None:
    nodes, caps = fleet
    models = {"m": entry(gpu_profile(gpus=gpus), min=wanted, max=wanted)}
    result = place(models, nodes, [])
    busy: Counter[str] = Counter()
    for p in result.placements:
        busy[p.nodes[0]] += gpus
    for ref, cap in caps.items():
        pdu = ref.split("=")[1]
        before = _draw(nodes, Counter(), pdu)
        after = _draw(nodes, busy, pdu)
        assert after <= cap or after == before  # over already (measured), nothing new was placed there
    # Every node left unused with free cards was refused by a cap, and the explanation says which.
    if result.unplaced:
        words = result.unplaced[0].explanation.rejections()["gpu"]
        for n in nodes:
            if len(n.gpus or ()) - busy[n.name] >= gpus:
                assert f"power: pdu={n.labels['llmgw.io/pdu']} would draw" in words[n.name]


def test_power_words_count_declared_derived_and_measured_draw() -> None:
    caps = {"pdu=p1": 3000.0}
    labels = _labels("r1", "p1")
    quiet = _node(
        "a", labels, gpus=2, watts=700.0, power_watts=500.0, power_caps=node_power_caps(labels, caps)
    )
    loud = _node(
        "b", labels, gpus=2, watts=700.0, power_draw_watts=1200.0, power_caps=node_power_caps(labels, caps)
    )
    models = {"m": entry(gpu_profile(gpus=1), min=2, max=2)}
    running = [replica("m-1", "m", "gpu", ("a", (0,)))]
    # a: 500 declared + 700 for its busy card = 1200; b: measured 1200 (declares nothing) -> 2400 drawn.
    exp = explain("m", models, [quiet, loud], running)
    assert exp.chosen is None
    assert (
        exp.rejections()["gpu"]["a"]
        == "power: pdu=p1 would draw 3,100 W of its 3,000 W cap (2,400 W now, the shard 700 W)"
    )
    # A class declaring no watts cannot be checked: accepted, and the explanation says so.
    unknown = [
        _node(
            n.name,
            labels,
            gpus=2,
            power_caps=n.power_caps,
            power_watts=n.power_watts,
            power_draw_watts=n.power_draw_watts,
        )
        for n in (quiet, loud)
    ]
    exp = explain("m", models, unknown, running)
    assert exp.chosen is not None
    assert "power: h100-80g declares no watts, pdu=p1 not checked" in exp.chosen.why
    # A node neither declaring nor reporting its draw is named, never counted as zero in silence.
    silent = _node("c", labels, gpus=2, watts=700.0, power_caps=node_power_caps(labels, caps))
    exp = explain("m", models, [silent], [])
    assert exp.chosen is not None
    assert "power: pdu=p1 counted without c declares no power_watts and reports no draw" in exp.chosen.why


def test_a_multi_node_replica_is_refused_when_its_shards_together_pass_the_cap() -> None:
    caps = {"rack=r1": 1500.0}
    labels = {"llmgw.io/rack": "r1"}
    nodes = [
        _node(
            n,
            labels,
            gpus=1,
            watts=700.0,
            power_watts=100.0,
            fabric="ib",
            power_caps=node_power_caps(labels, caps),
        )
        for n in ("a", "b")
    ]
    models = {"m": entry(gpu_profile(gpus=1, nodes=2, keep_within="rack"))}
    exp = explain("m", models, nodes, [])
    # Each shard alone fits (200 W drawn + 700 W), both together do not (1,600 W).
    assert exp.chosen is None
    assert all(v.accepted for v in exp.profiles[0].verdicts)
    assert exp.profiles[0].summary == (
        "needs 2 nodes of one fabric and one rack that fit: ib rack r1 has 2 (together: power: rack=r1 would "
        "draw 1,600 W of its 1,500 W cap (900 W now, the shard 700 W))"
    )
    caps["rack=r1"] = 1600.0
    nodes = [NodeView(**{**_fields(n), "power_caps": node_power_caps(labels, caps)}) for n in nodes]
    assert place(models, nodes, []).placements[0].nodes == ("a", "b")
