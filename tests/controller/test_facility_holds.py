"""`llmgw facility hold|release` on a real fleet: a held rack takes nothing new, `--drain` moves what runs there
to another rack, `explain` names the hold, the hold outlives a controller restart, and release undoes it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import cli, sim_model
from controller.helpers import cluster_yaml

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()
        c.agents.cleanup()


async def _ready_on(cluster: Cluster, model: str, node: str) -> list[dict] | None:
    assert cluster.admin is not None
    items = await cluster.admin.replicas(model)
    return items if [(r["node"], r["state"]) for r in items] == [(node, "ready")] else None


async def test_a_held_rack_takes_nothing_new_and_drain_moves_what_runs_there(cluster: Cluster) -> None:
    cluster.repo.write({"cluster.yaml": cluster_yaml(unreachable="2s", lost="30s")}, "cluster")
    admin = await cluster.start_controller()
    for node, rack in (("n1", "r1"), ("n2", "r2")):
        cluster.agents.start(node, cluster.address, extra={"labels": {"llmgw.io/rack": rack}})

    async def both_ready() -> bool:
        return all([await admin.node_state(n) == "Ready" for n in ("n1", "n2")])

    await wait_for(both_ready, 30, "n1 and n2 Ready")
    cluster.repo.write({"models/m.yaml": sim_model("m", 1)}, "m")
    [placed] = await cluster.wait_ready("m", 1)
    where, other = (placed["node"], "n2") if placed["node"] == "n1" else (placed["node"], "n1")
    rack = "r1" if where == "n1" else "r2"

    code, out = await asyncio.to_thread(cli, cluster, "facility", "hold", f"rack={rack}", "--drain")
    assert code == 0, out
    assert f"rack={rack} held ({where})." in out and "Moving 1 replica(s) elsewhere." in out
    await wait_for(lambda: _ready_on(cluster, "m", other), 60, f"m moved from {where} to {other}")

    # Hold the other rack too (no drain): m keeps running there, a new model has nowhere to go.
    other_rack = "r2" if rack == "r1" else "r1"
    code, out = await asyncio.to_thread(cli, cluster, "facility", "hold", f"rack={other_rack}")
    assert code == 0, out
    cluster.repo.write({"models/k.yaml": sim_model("k", 1)}, "k")

    async def k_applied() -> bool:
        return "k" in {m["model"] for m in (await admin.get("/api/v1/models"))["models"]}

    await wait_for(k_applied, 30, "k applied")
    found = await admin.get("/api/v1/explain/k")
    assert found["would_place"] is None
    words = {n["node"]: n["words"] for n in found["profiles"][0]["nodes"]}
    assert words[where].startswith(f"facility hold: rack={rack} (by ")
    assert f"llmgw facility release rack={rack}" in words[where]
    assert words[other].startswith(f"facility hold: rack={other_rack} (by ")
    assert (await _ready_on(cluster, "m", other)) is not None  # a hold without --drain moves nothing

    # The holds are in the store: a restarted controller keeps them.
    await cluster.stop_controller()
    admin = await cluster.start_controller()
    code, out = await asyncio.to_thread(cli, cluster, "facility", "holds", "--json")
    assert code == 0, out
    assert [(h["domain"], h["drain"]) for h in json.loads(out)["holds"]] == sorted(
        [(f"rack={rack}", True), (f"rack={other_rack}", False)]
    )

    code, out = await asyncio.to_thread(cli, cluster, "facility", "release", f"rack={other_rack}")
    assert code == 0 and f"rack={other_rack} released" in out, out
    await wait_for(
        lambda: _ready_on(cluster, "k", other), 60, f"k placed on {other} once its rack is released"
    )
    audit = await admin.get("/api/v1/audit")
    actions = {(e["action"], e["object"]) for e in audit["entries"]}
    assert {("facility.hold", f"rack={rack}"), ("facility.release", f"rack={other_rack}")} <= actions


async def test_a_domain_that_is_not_level_equals_value_is_refused_with_what_would_be_right(
    cluster: Cluster,
) -> None:
    cluster.repo.write({"cluster.yaml": cluster_yaml()}, "cluster")
    await cluster.start_controller()
    code, out = await asyncio.to_thread(cli, cluster, "facility", "hold", "shelf=s1")
    assert code == 1
    assert (
        "'shelf=s1' is not a facility domain: write LEVEL=VALUE, LEVEL one of site, room, row, rack, pdu"
        in out
    )
