"""Fault: the leader controller's host powered off while a canary runs, the standby on another host; commit
statuses go to a forge (the test's own status API, on the lab's network).

Must hold: the standby leads and judges the same canary run (its start kept, `canary_started` once), promotes
it and finishes the roll. Must not be lost, nor doubled: the commit statuses: the forge is told the canary's
`pending` once and its verdict once, whichever controller posted them. Needs the continuity branch's durable
intent (canary runs and owed statuses in the store).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from controller.fleet_ops import sim_model
from controller.test_canary_commit_status import TOKEN, Forge
from support import wait_until

from hosts.lab import HostLab

pytestmark = [pytest.mark.hosts, pytest.mark.postgres]

ROLLOUT = (
    "\n  rollout:\n    strategy: canary\n"
    "    canary: {weight: 50, duration: 5s, gates: {min_requests: 0, max_ttft_ratio: null}}"
)


@pytest.fixture
def lab_forge(lab: HostLab) -> Iterator[Forge]:
    """The forge on its own event loop in a thread, listening on the test's address in the lab."""
    forge = Forge(host=lab.net.test_address)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="forge", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(forge.start(), loop).result(10)
    try:
        yield forge
    finally:
        assert forge.runner is not None
        asyncio.run_coroutine_threadsafe(forge.runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def canary(lab: HostLab, controller: str) -> dict[str, Any] | None:
    try:
        models = lab.get(controller, "/api/v1/status")["models"]
    except OSError:
        return None
    found = next((m for m in models if m["model"] == "m"), None)
    return found["canary"] if found is not None else None


def test_leader_host_lost_mid_canary_the_standby_promotes_it_statuses_once(
    lab: HostLab, lab_forge: Forge
) -> None:
    for name in ("db", "ca", "cb", "n1", "n2"):
        lab.add_host(name)
    lab.start_postgres("db")
    (lab.tmp / "forge-token").write_text(TOKEN + "\n")
    forge = {"commit_status_url": lab_forge.base, "commit_status_token_file": str(lab.tmp / "forge-token")}
    lab.cluster(unreachable="2s", lost="60s")
    lab.start_controller("ca", **forge)
    wait_until(lambda: lab.role("ca") == "leader", 30, "ca to lead")
    lab.start_controller("cb", **forge)
    wait_until(lambda: lab.role("cb") == "standby", 30, "cb to stand by")
    for node in ("n1", "n2"):
        lab.start_agent(node, ["ca", "cb"])
    lab.repo.write({"models/m.yaml": sim_model("m", 2, extra=ROLLOUT)}, "m")
    stable = set(wait_until(lambda: lab.ready("ca", "m", 2), 60, "two stable replicas ready"))
    tried = lab.repo.write({"models/m.yaml": sim_model("m", 2, extra=ROLLOUT, args="decode_ms_per_token: 3")})

    def on(context: str) -> list[str]:
        return [
            g["body"]["state"]
            for g in lab_forge.posted()
            if g["path"].endswith(f"/statuses/{tried}") and g["body"]["context"] == context
        ]

    def serving() -> dict[str, Any] | None:
        run = canary(lab, "ca")
        ready = {r["id"] for r in lab.replicas("ca", "m") or [] if r["state"] == "ready"}
        ok = (
            run is not None
            and run["phase"] == "running"
            and run["replicas"]
            and set(run["replicas"]) <= ready
        )
        return run if ok and on("llmgw/canary/m") == ["pending"] else None

    before = wait_until(serving, 60, "the canary serving on ca, its pending posted")
    lab.hosts["ca"].power_off()
    wait_until(lambda: lab.role("cb") == "leader", 30, "cb to lead after ca's host went down")
    after = wait_until(
        lambda: (run := canary(lab, "cb")) is not None and run["phase"] == "promoted" and run,
        60,
        "promoted by cb",
    )
    assert after["started_at"] == before["started_at"] and after["replicas"] == before["replicas"]

    def rolled() -> set[str] | None:
        items = lab.ready("cb", "m", 2)
        stale = any(r["stale_profile"] for r in lab.replicas("cb", "m") or [])
        return set(items) if items and not stale else None

    assert not wait_until(rolled, 60, "the roll finished by cb") & stable
    wait_until(lambda: on("llmgw/canary/m") == ["pending", "success"], 60, "the verdict posted")
    wait_until(lambda: on("llmgw/apply")[-1:] == ["success"], 60, "the apply healthy")
    assert on("llmgw/canary/m") == ["pending", "success"], "a status was posted twice"
    kinds = [e["kind"] for e in lab.events("cb", 0) if e["object"] == "m"]
    assert kinds.count("canary_started") == 1 and kinds.count("canary_promoted") == 1, kinds
