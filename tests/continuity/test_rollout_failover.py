"""A rollout survives its leader (issue 39): two controller processes on one PostgreSQL store, the leader killed
with -9 once a roll under `rollout.on_change: restart` has begun (its first replacement started, both old
replicas still there); the standby leads and finishes the same roll: the replacement counts as the surge it
was (not one more replica to scale away), both stale replicas are rolled, no replica more than the roll asks
for is started, and the model says Healthy only once every replica runs the revision. (A controller restarted
halfway through a roll: test_rollout_restart.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller.fleet_ops import sim_model
from faults.procs import ControllerProc
from faults.test_failover import Pair, get, role
from support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

ROLLOUT = "\n  rollout: {on_change: restart, max_surge: 1, max_unavailable: 0}"


@pytest.fixture
def pair(tmp_path: Path, pg_dsn: str) -> Iterator[Pair]:
    p = Pair(tmp_path, pg_dsn)
    try:
        yield p
    finally:
        p.close()


def _replicas(c: ControllerProc) -> list[dict[str, Any]]:
    try:
        return [r for r in get(c, "/api/v1/replicas")["replicas"] if r["model"] == "m"]
    except OSError:
        return []


def _health(c: ControllerProc) -> str | None:
    try:
        models = get(c, "/api/v1/status")["models"]
    except OSError:
        return None
    return next((m["health"] for m in models if m["model"] == "m"), None)


def test_a_leader_killed_mid_rollout_the_standby_finishes_the_same_rollout(pair: Pair) -> None:
    pair.repo.write({"cluster.yaml": pair.cluster(unreachable="2s", lost="60s")}, "cluster")
    a = pair.start("a")
    wait_until(lambda: role(a) == "leader", 30, "controller a to lead")
    b = pair.start("b")
    wait_until(lambda: role(b) == "standby", 30, "controller b to stand by")
    for node in ("n1", "n2"):
        pair.agents.start(node, [a.url, b.url])
    pair.repo.write({"models/m.yaml": sim_model("m", 2, extra=ROLLOUT)}, "m")

    def ready(c: ControllerProc) -> list[dict[str, Any]] | None:
        items = _replicas(c)
        return items if len(items) == 2 and all(r["state"] == "ready" for r in items) else None

    first = {r["id"] for r in wait_until(lambda: ready(a), 60, "two replicas ready on leader a")}
    changed = sim_model("m", 2, extra=ROLLOUT, args="decode_ms_per_token: 3")
    pair.repo.write({"models/m.yaml": changed}, "a changed profile rolls")

    def begun() -> list[dict[str, Any]] | None:
        items = _replicas(a)
        # Its replacement running on an agent (one only asked for may never have reached it).
        new = [r for r in items if r["id"] not in first and r["state"] in ("starting", "ready")]
        return new if new and first <= {r["id"] for r in items} else None

    started = {r["id"] for r in wait_until(begun, 60, "the roll begun on leader a")}
    a.proc.kill()
    a.proc.wait(10)
    wait_until(lambda: role(b) == "leader", 30, "controller b to lead after a was killed")
    healthy_while_stale: list[list[dict[str, Any]]] = []

    def rolled() -> list[dict[str, Any]] | None:
        items = _replicas(b)
        serving = [r for r in items if r["state"] not in ("draining", "stopping", "stopped")]
        if _health(b) == "Healthy" and any(r["stale_profile"] for r in serving):
            healthy_while_stale.append(serving)
        current = [r for r in items if r["state"] == "ready" and not r["stale_profile"]]
        done = len(items) == 2 and len(current) == 2 and not first & {r["id"] for r in items}
        return items if done else None

    after = wait_until(rolled, 90, "the roll finished by controller b")
    wait_until(lambda: _health(b) == "Healthy", 30, "m Healthy on controller b")
    assert healthy_while_stale == [], healthy_while_stale[:1]
    assert started <= {r["id"] for r in after}, "the replacement leader a started was not the one kept"
    starts = [e for e in get(b, "/api/v1/events?limit=1000")["events"] if e["kind"] == "replica_start"]
    assert len(starts) == 4, [e["message"] for e in starts]  # two at first, one per rolled replica
