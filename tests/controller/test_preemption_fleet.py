"""Preemption on a real fleet: a critical model committed to a node full of batch replicas is placed, one
batch replica yielding its room after its grace, and the events say who yielded to whom and what was cut."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import bring_up, sim_model

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
