"""Preemption on a real fleet: a critical model committed to a node full of batch replicas is placed, one
batch replica yielding its room after its grace, and the events say who yielded to whom and what was cut."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import Load, bring_up, openai_client, routed, router_for, sim_model
from llmgw.controller.loops import yielding

pytestmark = pytest.mark.integration

CLASSES = "  classes: [critical, batch]\n  preemption_grace: 3s\n"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()
        c.agents.cleanup()


async def test_a_critical_model_on_a_node_full_of_batch_replicas_gets_placed(cluster: Cluster) -> None:
    batch = sim_model("batch", 2, cores=2, extra="\n  class: batch")
    await bring_up(cluster, ["n1"], {"models/batch.yaml": batch}, CLASSES)  # 4 cores: two batch replicas
    before = {r["id"] for r in await cluster.wait_ready("batch", 2)}
    assert cluster.admin is not None

    cluster.repo.write({"models/chat.yaml": sim_model("chat", 1, cores=2, extra="\n  class: critical")})
    await cluster.wait_ready("chat", 1, "the critical model placed in a batch replica's room")

    async def one_batch_left() -> list[str] | None:
        items = await cluster.admin.replicas("batch")  # type: ignore[union-attr]
        return [r["id"] for r in items] if len(items) == 1 else None

    left = await wait_for(one_batch_left, 30, "one batch replica left")
    assert set(left) < before, "the other batch replica kept running, untouched"
    events = await cluster.events()
    preempted = [e for e in events if e["kind"] == "replica_preempted"]
    assert len(preempted) == 1, preempted
    assert "yields n1 to chat (critical)" in preempted[0]["message"]
    assert preempted[0]["object"] in before and preempted[0]["object"] not in left
    yielded = [e for e in events if e["kind"] == "replica_yielded"]
    assert len(yielded) == 1 and "yielded to chat" in yielded[0]["message"]
    assert "0 requests cut" in yielded[0]["message"], yielded[0]["message"]  # read from the engine: idle
    status = await cluster.admin.get("/api/v1/status")
    batch_health = next(m for m in status["models"] if m["model"] == "batch")
    assert batch_health["ready"] == 1 and "cannot be placed" in (batch_health["waiting"] or "")


async def test_requests_still_running_when_the_grace_ends_are_counted_as_cut(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Each batch request decodes for 40 x 150 ms = 6 s, far beyond a 1 s grace.
    slow = sim_model("batch", 2, cores=2, extra="\n  class: batch", args="decode_ms_per_token: 150")
    grace = "  classes: [critical, batch]\n  preemption_grace: 1s\n"
    await bring_up(cluster, ["n1"], {"models/batch.yaml": slow}, grace)
    await cluster.wait_ready("batch", 2)
    router = router_for(tmp_path, cluster)
    try:
        client = openai_client(router)
        await routed(client, "batch")
        load = Load(client, "batch", workers=6, max_tokens=40)
        async with load.running():

            async def both_busy() -> bool:
                return await _running_everywhere(cluster)

            await wait_for(both_busy, 30, "requests running on both batch replicas")
            cluster.repo.write(
                {"models/chat.yaml": sim_model("chat", 1, cores=2, extra="\n  class: critical")}
            )
            await cluster.wait_ready("chat", 1, "the critical model placed")
        await client.close()
    finally:
        router.stop()
    [yielded] = [e for e in await cluster.events() if e["kind"] == "replica_yielded"]
    found = re.search(r"after ([0-9.]+)s of its 1s grace; (\d+) requests? cut", yielded["message"])
    assert found is not None, yielded["message"]
    assert float(found.group(1)) >= 1.0 and int(found.group(2)) >= 1


async def _running_everywhere(cluster: Cluster) -> bool:
    """Every batch replica's engine runs a request, read as the grace reads it (its own running gauge)."""
    assert cluster.running is not None
    c = cluster.running.controller
    recs = [r for r in c.replicas.values() if r.model == "batch"]
    async with aiohttp.ClientSession() as session:
        counts = [await yielding.in_flight(c, rec, session) for rec in recs]
    return len(recs) == 2 and all(n is not None and n >= 1 for n in counts)
