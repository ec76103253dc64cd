"""Rolling restarts on a real fleet under load through a router: `POST /api/v1/restart` (what `llmgw restart`
sends) and a changed profile with `rollout.on_change: restart` replace every replica make-before-break, and no
request fails meanwhile."""

from __future__ import annotations

import asyncio
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


async def _replaced(cluster: Cluster, model: str, old: set[str], count: int) -> list[str] | None:
    items = await cluster.admin.replicas(model)  # type: ignore[union-attr]
    ids = {r["id"] for r in items}
    ready = [r["id"] for r in items if r["state"] == "ready"]
    return ready if not ids & old and len(ready) == count and len(items) == count else None


async def test_restart_and_a_changed_profile_roll_with_no_failed_request(
    cluster: Cluster, tmp_path: Path
) -> None:
    rollout = "\n  rollout: {on_change: restart, max_surge: 1, max_unavailable: 0}"
    await bring_up(cluster, ["n1", "n2"], {"models/m.yaml": sim_model("m", 2, extra=rollout)})
    first = {r["id"] for r in await cluster.wait_ready("m", 2)}
    assert cluster.admin is not None
    router = router_for(tmp_path, cluster)
    try:
        client = openai_client(router)
        await routed(client, "m")
        load = Load(client, "m")
        async with load.running():
            # `llmgw restart m` (POST /api/v1/restart), in a thread: it waits for the roll to end.
            code, out = await asyncio.to_thread(cli, cluster, "restart", "m", "--timeout", "90s")
            assert code == 0, out
            assert "Restarting 2 replica(s) of m (max_surge 1, max_unavailable 0)." in out
            assert out.rstrip().endswith("m restarted.")
            second = set(await wait_for(lambda: _replaced(cluster, "m", first, 2), 30, "m restarted"))
            answered_during_restart = load.answered

            # A changed profile rolls by itself (rollout.on_change: restart).
            changed = sim_model("m", 2, extra=rollout, args="decode_ms_per_token: 3")
            cluster.repo.write({"models/m.yaml": changed}, "slower decode")

            async def rolling() -> dict | None:
                status = await cluster.admin.get("/api/v1/status")  # type: ignore[union-attr]
                m = next(x for x in status["models"] if x["model"] == "m")
                return m if m["rolling"] else None

            seen = await wait_for(rolling, 30, "the status to say m is rolling")
            assert seen["health"] == "Progressing"  # what keeps `llmgw apply --wait` waiting
            await wait_for(lambda: _replaced(cluster, "m", second, 2), 90, "m rolled to its new profile")
        await client.close()
    finally:
        router.stop()
    assert load.failures == [], load.failures[:5]
    assert answered_during_restart > 0 and load.answered > answered_during_restart
    kinds = [e["kind"] for e in await cluster.events()]
    assert "restart_asked" in kinds
    audit = await cluster.admin.get("/api/v1/audit")
    assert any(e["action"] == "restart" and e["object"] == "m" for e in audit["entries"])
    status = await cluster.admin.get("/api/v1/status")
    m = next(x for x in status["models"] if x["model"] == "m")
    assert (m["health"], m["rolling"], m["stale_replicas"]) == ("Healthy", False, 0)
