"""Fault: the leader controller cut from the store (PostgreSQL on its own host), everything else still connected.

Must hold: the leader steps down before its lease could have ended in the store (it never leads while another
does: sampled throughout, never two leaders); the standby takes the lease at a higher epoch; a write the deposed
leader makes with what it held, after the partition heals, is refused by the store (fenced by the epoch).
Must not be lost: the replica and its engine (same id, same process): nothing restarted for the partition.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from controller.helpers import model_yaml
from support import wait_until

from hosts.lab import HostLab
from llmgw.controller.parts.lease import LEASE_NAME
from llmgw.store import Fence, LeaseFenced, ReplicaRecord, Store

pytestmark = [pytest.mark.hosts, pytest.mark.postgres]


def test_leader_cut_from_the_store_steps_down_and_its_late_write_is_fenced(lab: HostLab) -> None:
    for name in ("db", "ca", "cb", "n1"):
        lab.add_host(name)
    lab.start_postgres("db")
    lab.cluster(unreachable="3s", lost="120s")
    lab.start_controller("ca")
    wait_until(lambda: lab.role("ca") == "leader", 30, "ca to lead")
    lab.start_controller("cb")
    wait_until(lambda: lab.role("cb") == "standby", 30, "cb to stand by")
    lab.start_agent("n1", ["ca", "cb"])
    lab.repo.write({"models/a.yaml": model_yaml("sim-a", min_=1)}, "add sim-a")
    before = wait_until(lambda: lab.ready("ca", "sim-a", 1), 90, "sim-a ready on ca's fleet")
    held = lab.leadership("ca")
    assert held is not None and held["epoch"] >= 1
    deposed = Fence(LEASE_NAME, held["holder"], held["epoch"])

    both: list[float] = []  # moments both said they led
    watching = threading.Event()
    watching.set()

    def watch() -> None:
        while watching.is_set():
            if lab.role("ca") == "leader" and lab.role("cb") == "leader":
                both.append(time.time())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    lab.net.cut("ca", "db")
    try:
        wait_until(lambda: lab.role("ca") == "standby", 30, "ca to step down, cut from its store")
        wait_until(lambda: lab.role("cb") == "leader", 30, "cb to lead")
    finally:
        watching.clear()
        watcher.join(10)
        lab.net.heal("ca", "db")
    assert both == [], "two controllers led at once"
    now = lab.leadership("cb")
    assert now is not None and now["epoch"] > deposed.epoch

    async def deposed_write() -> None:
        store = await Store.open(lab.dsn)
        try:
            replica = ReplicaRecord("r-deposed", "sim-a", "sim", ("n1",), "starting", "fp", 1.0, 1.0)
            with pytest.raises(LeaseFenced, match=f"not by {deposed.holder} at epoch {deposed.epoch}"):
                await store.upsert_replica(replica, fence=deposed)
            assert "r-deposed" not in {r.id for r in await store.list_replicas()}
        finally:
            await store.close()

    asyncio.run(deposed_write())
    # Healed, ca stays a standby (cb holds the lease), and cb kept the same replica and engine.
    wait_until(lambda: (lab.leadership("ca") or {}).get("leader") == now["holder"], 30, "ca to name cb")
    assert lab.role("ca") == "standby"
    assert wait_until(lambda: lab.ready("cb", "sim-a", 1), 60, "sim-a on cb's fleet") == before
