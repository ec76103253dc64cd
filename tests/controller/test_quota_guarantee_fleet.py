"""Guaranteed capacity on a real fleet (a controller, an agent, sim engines): a team within its guarantee takes
back what another team borrowed beyond its own, through preemption; a replica within its owner's guarantee is
never taken for another team, not even for a model of a higher class."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import bring_up, sim_model

pytestmark = pytest.mark.integration


def tenants(guarantee_a: int | None, guarantee_b: int) -> dict[str, str]:
    """Organization acme with teams a and b; each guaranteed CPU cores of the `cpu` class (None: none)."""

    def team(name: str, cores: int | None) -> str:
        capacity = "" if cores is None else f", capacity: {{cpu: {{guaranteed: {{cpu_cores: {cores}}}}}}}"
        return f"apiVersion: llmgw/v1\nkind: Team\nmetadata: {{name: {name}}}\nspec: {{organization: acme{capacity}}}\n"

    return {
        "tenants/acme.yaml": "apiVersion: llmgw/v1\nkind: Organization\nmetadata: {name: acme}\n",
        "tenants/a.yaml": team("a", guarantee_a),
        "tenants/b.yaml": team("b", guarantee_b),
    }


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()
        c.agents.cleanup()


async def _count(cluster: Cluster, model: str, n: int) -> list[str] | None:
    assert cluster.admin is not None
    items = await cluster.admin.replicas(model)
    return [r["id"] for r in items] if len(items) == n and all(r["state"] == "ready" for r in items) else None


async def test_a_team_within_its_guarantee_takes_back_what_another_borrowed(cluster: Cluster) -> None:
    # n1 has 4 cores. Team b is guaranteed 2 and runs two 2-core replicas: 2 cores are borrowed.
    batch = sim_model("batch", 2, cores=2, extra="\n  owner: b")
    await bring_up(cluster, ["n1"], {**tenants(2, 2), "models/batch.yaml": batch})
    before = {r["id"] for r in await cluster.wait_ready("batch", 2)}

    # Team a, within its guarantee of 2 cores, wants one 2-core replica: one of b's yields (the borrowed one).
    cluster.repo.write({"models/chat.yaml": sim_model("chat", 1, cores=2, extra="\n  owner: a")}, "chat")
    await cluster.wait_ready("chat", 1, "chat placed in the room taken back from team b")
    left = await wait_for(lambda: _count(cluster, "batch", 1), 30, "one batch replica left")
    assert set(left) < before
    [taken] = [e for e in await cluster.events() if e["kind"] == "replica_preempted"]
    assert taken["object"] in before - set(left)
    assert "borrowed: Team b holds 4 CPU cores, 2 guaranteed" in taken["message"], taken["message"]
    assert "taken back within Team a's guarantee" in taken["message"]

    # Team b, now at its guarantee, keeps its last replica: its second one waits, and nothing flaps back.
    assert cluster.admin is not None
    found = await cluster.admin.get("/api/v1/explain/batch")
    assert found["would_place"] is None
    status = await cluster.admin.get("/api/v1/status")
    batch_health = next(m for m in status["models"] if m["model"] == "batch")
    assert batch_health["ready"] == 1 and "cannot be placed" in (batch_health["waiting"] or "")
    assert await _count(cluster, "chat", 1) is not None
    assert len([e for e in await cluster.events() if e["kind"] == "replica_preempted"]) == 1


async def test_a_replica_within_its_owners_guarantee_is_not_taken_for_a_higher_class(
    cluster: Cluster,
) -> None:
    classes = "  classes: [critical, batch]\n  preemption_grace: 1s\n"
    batch = sim_model("batch", 2, cores=2, extra="\n  owner: b\n  class: batch")
    await bring_up(cluster, ["n1"], {**tenants(None, 2), "models/batch.yaml": batch}, classes)
    before = {r["id"] for r in await cluster.wait_ready("batch", 2)}

    # A critical model of team a (no guarantee) wants both replicas' room; only the borrowed one yields.
    chat = sim_model("chat", 2, cores=2, extra="\n  owner: a\n  class: critical")
    cluster.repo.write({"models/chat.yaml": chat}, "chat")

    async def one_each() -> bool:
        assert cluster.admin is not None
        chats = [r for r in await cluster.admin.replicas("chat") if r["state"] == "ready"]
        return len(chats) == 1 and await _count(cluster, "batch", 1) is not None

    await wait_for(one_each, 60, "one chat replica in the borrowed room, one batch replica kept")
    assert cluster.admin is not None
    found = await cluster.admin.get("/api/v1/explain/chat")
    assert found["would_place"] is None
    kept = await _count(cluster, "batch", 1)
    assert kept is not None and set(kept) < before
    preempted = [e for e in await cluster.events() if e["kind"] == "replica_preempted"]
    assert len(preempted) == 1 and preempted[0]["object"] not in kept
