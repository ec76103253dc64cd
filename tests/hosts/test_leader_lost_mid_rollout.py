"""Fault: the leader controller's host powered off once a roll has begun (under `rollout.on_change: restart`, its
first replacement started, both old replicas still there), the standby on another host.

Must hold: the standby leads and finishes the same roll: the replacement the lost leader started is kept as the
surge it was, both stale replicas are rolled, the model says Healthy only once every replica runs the revision.
Must not be lost: the roll (not restarted from scratch, not abandoned as "adopted"): exactly one start per
rolled replica after the two first ones. Needs the continuity branch's durable intent (the roll in the store).
"""

from __future__ import annotations

from typing import Any

import pytest
from controller.fleet_ops import sim_model
from support import wait_until

from hosts.lab import HostLab

pytestmark = [pytest.mark.hosts, pytest.mark.postgres]

ROLLOUT = "\n  rollout: {on_change: restart, max_surge: 1, max_unavailable: 0}"


def health(lab: HostLab, controller: str) -> str | None:
    try:
        models = lab.get(controller, "/api/v1/status")["models"]
    except OSError:
        return None
    return next((m["health"] for m in models if m["model"] == "m"), None)


def test_leader_host_lost_mid_rollout_the_standby_finishes_the_same_roll(lab: HostLab) -> None:
    for name in ("db", "ca", "cb", "n1", "n2"):
        lab.add_host(name)
    lab.start_postgres("db")
    lab.cluster(unreachable="2s", lost="60s")
    lab.start_controller("ca")
    wait_until(lambda: lab.role("ca") == "leader", 30, "ca to lead")
    lab.start_controller("cb")
    wait_until(lambda: lab.role("cb") == "standby", 30, "cb to stand by")
    for node in ("n1", "n2"):
        lab.start_agent(node, ["ca", "cb"])
    lab.repo.write({"models/m.yaml": sim_model("m", 2, extra=ROLLOUT)}, "m")
    first = set(wait_until(lambda: lab.ready("ca", "m", 2), 60, "two replicas of m ready on ca"))
    lab.repo.write({"models/m.yaml": sim_model("m", 2, extra=ROLLOUT, args="decode_ms_per_token: 3")}, "roll")

    def begun() -> set[str] | None:
        items = lab.replicas("ca", "m") or []
        new = {r["id"] for r in items if r["id"] not in first and r["state"] in ("starting", "ready")}
        return new if new and first <= {r["id"] for r in items} else None

    started = wait_until(begun, 60, "the roll begun on ca")
    lab.hosts["ca"].power_off()
    wait_until(lambda: lab.role("cb") == "leader", 30, "cb to lead after ca's host went down")
    healthy_while_stale: list[list[dict[str, Any]]] = []

    def rolled() -> list[dict[str, Any]] | None:
        items = lab.replicas("cb", "m") or []
        serving = [r for r in items if r["state"] not in ("draining", "stopping", "stopped")]
        if health(lab, "cb") == "Healthy" and any(r["stale_profile"] for r in serving):
            healthy_while_stale.append(serving)
        current = [r for r in items if r["state"] == "ready" and not r["stale_profile"]]
        done = len(items) == 2 and len(current) == 2 and not first & {r["id"] for r in items}
        return items if done else None

    after = wait_until(rolled, 90, "the roll finished by cb")
    wait_until(lambda: health(lab, "cb") == "Healthy", 30, "m Healthy on cb")
    assert healthy_while_stale == [], healthy_while_stale[:1]
    assert started <= {r["id"] for r in after}, "the replacement ca started was not the one kept"
    starts = [e for e in lab.events("cb", 0) if e["kind"] == "replica_start"]
    assert len(starts) == 4, [e["message"] for e in starts]  # two at first, one per rolled replica
