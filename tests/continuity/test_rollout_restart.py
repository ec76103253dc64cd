"""A controller restarted mid-rollout finishes the same rollout (issue 39): a commit that changes a model's
profile under `rollout.on_change: restart` rolls every replica, whether the controller restarts right after
the commit (on SQLite) or halfway through (on PostgreSQL; the leader killed halfway through is
test_rollout_failover.py). The restart itself starts nothing: the
replicas it finds are the same replicas (same ids and PIDs for the current ones), the stale ones are rolled
as before, and the model says Healthy only once every replica runs what the revision declares."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from controller.fleet_ops import sim_model
from faults.cluster import Cluster
from support import wait_for

pytestmark = pytest.mark.integration

ROLLOUT = "\n  rollout: {on_change: restart, max_surge: 1, max_unavailable: 0}"


@pytest.fixture(
    params=[("committed", "sqlite"), pytest.param(("half-rolled", "postgres"), marks=pytest.mark.postgres)],
    ids=["committed-sqlite", "half-rolled-postgres"],
)
async def at_phase(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Cluster, str]]:
    """A cluster, and the phase of the roll its controller is restarted at."""
    phase, backend = request.param
    dsn = request.getfixturevalue("pg_dsn") if backend == "postgres" else f"sqlite:///{tmp_path / 'llmgw.db'}"
    c = Cluster(tmp_path, dsn=dsn)
    try:
        yield c, phase
    finally:
        await c.close()


async def _model(cluster: Cluster, name: str) -> dict[str, Any]:
    """The model's status; {} while the controller has no revision applied (just restarted)."""
    assert cluster.admin is not None
    status = await cluster.admin.get("/api/v1/status")
    return next((m for m in status["models"] if m["model"] == name), {})


class Watch:
    """Samples the model while it rolls: Healthy is said only when no replica is stale, and the fleet never
    holds more than the target and the surge (replicas on their way out not counted)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.most = 0
        self.healthy_while_stale: list[dict[str, Any]] = []

    async def sample(self) -> list[dict[str, Any]]:
        assert self.cluster.admin is not None
        items: list[dict[str, Any]] = await self.cluster.admin.replicas("m")
        serving = [r for r in items if r["state"] not in ("draining", "stopping", "stopped")]
        self.most = max(self.most, len(serving))
        m = await _model(self.cluster, "m")
        if m.get("health") == "Healthy" and any(r["stale_profile"] for r in serving):
            self.healthy_while_stale.append(m)
        return items


async def test_a_restart_mid_rollout_finishes_the_same_rollout(at_phase: tuple[Cluster, str]) -> None:
    cluster, phase = at_phase
    await cluster.bring_up(["n1", "n2"], {"models/m.yaml": sim_model("m", 2, extra=ROLLOUT)})
    first = {r["id"]: r["pid"] for r in await cluster.wait_ready("m", 2)}
    changed = sim_model("m", 2, extra=ROLLOUT, args="decode_ms_per_token: 3")
    cluster.repo.write({"models/m.yaml": changed}, "a changed profile rolls")
    watch = Watch(cluster)

    async def reached() -> list[dict[str, Any]] | None:
        items = await watch.sample()
        new = [r for r in items if r["id"] not in first]
        if phase == "committed":  # the replacement asked for, no old one gone yet
            return items if new and set(first) <= {r["id"] for r in items} else None
        gone = set(first) - {r["id"] for r in items}
        ready_new = [r for r in new if r["state"] == "ready"]
        return items if len(gone) == 1 and ready_new else None

    before = await wait_for(reached, 60, f"the rollout at phase {phase}")
    kept = {r["id"]: r["pid"] for r in before if r["id"] not in first and r["state"] == "ready"}

    await cluster.stop_controller()
    await cluster.start_controller()

    async def rolled() -> list[dict[str, Any]] | None:
        items = await watch.sample()
        current = [r for r in items if r["state"] == "ready" and not r["stale_profile"]]
        return (
            items
            if len(items) == 2 and len(current) == 2 and not set(first) & {r["id"] for r in items}
            else None
        )

    after = await wait_for(rolled, 90, "every replica rolled to the new profile after the restart")
    await wait_for(lambda: _healthy(cluster), 30, "m Healthy once it runs the revision")
    assert watch.healthy_while_stale == [], watch.healthy_while_stale[:1]
    assert watch.most <= 3, f"more than target 2 + max_surge 1 replicas at once: {watch.most}"
    # A replica started before the restart and current is the same one after it (same id, same PID).
    assert {r["id"]: r["pid"] for r in after if r["id"] in kept} == kept
    events = await cluster.events()
    starts = [e for e in events if e["kind"] == "replica_start"]
    assert len(starts) == 4, _story(events)  # two at first, one per rolled replica: no more


async def _healthy(cluster: Cluster) -> bool:
    return (await _model(cluster, "m")).get("health") == "Healthy"


def _story(events: list[dict[str, Any]]) -> str:
    """The events oldest first, one line each: what a failure needs to tell which start was one too many."""
    return "\n".join(f"{e['time']:.3f} {e['kind']} {e['object']} {e['message']}" for e in reversed(events))
