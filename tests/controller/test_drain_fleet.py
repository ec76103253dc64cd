"""`llmgw node drain` on a real fleet under load: the node's replica moves to the other node
make-before-break with no failed request, nothing new is placed on the drained node, and uncordon undoes it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import Load, bring_up, cli, openai_client, routed, router_for, sim_model

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()
        c.agents.cleanup()


async def _node(cluster: Cluster, name: str) -> dict:
    nodes = (await cluster.admin.get("/api/v1/nodes"))["nodes"]  # type: ignore[union-attr]
    return next(n for n in nodes if n["name"] == name)


async def test_drain_moves_replicas_with_no_failed_request_and_uncordon_undoes_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    await bring_up(cluster, ["n1", "n2"], {"models/m.yaml": sim_model("m", 1)})
    [placed] = await cluster.wait_ready("m", 1)
    where = placed["node"]
    other = "n2" if where == "n1" else "n1"
    assert cluster.admin is not None
    router = router_for(tmp_path, cluster)
    try:
        client = openai_client(router)
        await routed(client, "m")
        load = Load(client, "m")
        async with load.running():
            # `llmgw node drain` (in a thread: the controller runs on this test's event loop) waits
            # until nothing runs on the node any more.
            code, out = await asyncio.to_thread(cli, cluster, "node", "drain", where, "--timeout", "60s")
            assert code == 0, out
            assert f"Node {where} cordoned; moving 1 replica(s) elsewhere." in out
            assert f"Node {where} is drained" in out
            items = await cluster.admin.replicas("m")
            assert [(r["node"], r["state"]) for r in items] == [(other, "ready")]
            answered_during_drain = load.answered
        await client.close()
    finally:
        router.stop()
    assert load.failures == [], load.failures[:5]
    assert answered_during_drain > 0
    node = await _node(cluster, where)
    assert node["cordoned"] and node["drained"] and node["replicas"] == []
    assert "drained" in node["cordon_reason"] and f"llmgw node uncordon {where}" in node["cordon_reason"]

    # Nothing new goes to the drained node: a second model lands on the other one.
    cluster.repo.write({"models/k.yaml": sim_model("k", 1)}, "another model")
    [k] = await cluster.wait_ready("k", 1)
    assert k["node"] == other

    # The drain is in the store: a restarted controller keeps the node cordoned.
    await cluster.stop_controller()
    await cluster.start_controller()

    async def back_drained() -> dict | None:
        nodes = (await cluster.admin.get("/api/v1/nodes"))["nodes"]  # type: ignore[union-attr]
        node = next((n for n in nodes if n["name"] == where and n["state"] == "Ready"), None)
        return node if node is not None and node["connected"] else None

    node = await wait_for(back_drained, 30, f"{where} reconnected to the restarted controller")
    assert node["drained"] and node["cordoned"]

    code, out = await asyncio.to_thread(cli, cluster, "node", "uncordon", where, "--json")
    assert code == 0 and json.loads(out)["was_drained"] is True, out
    node = await _node(cluster, where)
    assert not node["cordoned"] and not node["drained"]
    audit = await cluster.admin.get("/api/v1/audit")
    actions = {(e["action"], e["object"]) for e in audit["entries"]}
    assert {("node.drain", where), ("node.uncordon", where)} <= actions
