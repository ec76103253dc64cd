"""A canary survives its leader (issue 39): two controller processes on one PostgreSQL store, the leader
killed with -9 mid-canary; the standby leads and goes on with the same run.

- killed while the canary runs: the new leader judges the same run (its start kept, `canary_started` once),
  promotes it and finishes the roll;
- killed after the canary failed: the model stays held under the new leader (the verdict kept, no second
  canary), and a stable replica that crashes then comes back with the stable profile, not the rejected one.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller.fleet_ops import sim_model
from controller.test_canary_fleet import EVAL
from faults.procs import ControllerProc
from faults.test_failover import Pair, get, role
from support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def _canary(gates: str, duration: str) -> str:
    return f"\n  rollout:\n    strategy: canary\n    canary: {{weight: 50, duration: {duration}, gates: {{{gates}}}}}"


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


def _canary_status(c: ControllerProc) -> dict[str, Any] | None:
    try:
        models = get(c, "/api/v1/status")["models"]
    except OSError:
        return None
    found = next((m for m in models if m["model"] == "m"), None)
    return found["canary"] if found is not None else None


def _ready(c: ControllerProc, count: int) -> list[dict[str, Any]] | None:
    items = _replicas(c)
    ok = len(items) == count and all(r["state"] == "ready" for r in items)
    return items if ok else None


def _events(c: ControllerProc, kind: str) -> list[dict[str, Any]]:
    """Every event of `kind` in the store, whichever leader recorded it."""
    return [e for e in get(c, "/api/v1/events?limit=1000")["events"] if e["kind"] == kind]


def _up(pair: Pair, models: dict[str, str]) -> tuple[ControllerProc, ControllerProc, list[dict[str, Any]]]:
    """Leader a, standby b, two nodes, model m with two ready replicas (the stable ones)."""
    pair.repo.write({"cluster.yaml": pair.cluster(unreachable="2s", lost="60s")}, "cluster")
    a = pair.start("a")
    wait_until(lambda: role(a) == "leader", 30, "controller a to lead")
    b = pair.start("b")
    wait_until(lambda: role(b) == "standby", 30, "controller b to stand by")
    for node in ("n1", "n2"):
        pair.agents.start(node, [a.url, b.url])
    pair.repo.write(models, "models")
    stable = wait_until(lambda: _ready(a, 2), 60, "two stable replicas ready")
    return a, b, stable


def _fail_over(a: ControllerProc, b: ControllerProc) -> None:
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    wait_until(lambda: role(b) == "leader", 30, "controller b to lead after a was killed")


def test_a_leader_killed_mid_canary_the_standby_promotes_the_same_canary(pair: Pair) -> None:
    rollout = _canary("min_requests: 0, max_ttft_ratio: null", duration="5s")
    a, b, stable = _up(pair, {"models/m.yaml": sim_model("m", 2, extra=rollout)})
    pair.repo.write({"models/m.yaml": sim_model("m", 2, extra=rollout, args="decode_ms_per_token: 3")}, "try")

    def canary_serving() -> dict[str, Any] | None:
        canary = _canary_status(a)
        ready = {r["id"] for r in _replicas(a) if r["state"] == "ready"}
        if canary is None or canary["phase"] != "running" or not canary["replicas"]:
            return None
        return canary if set(canary["replicas"]) <= ready else None

    before = wait_until(canary_serving, 60, "the canary replica serving on leader a")
    _fail_over(a, b)

    def promoted() -> dict[str, Any] | None:
        canary = _canary_status(b)
        return canary if canary is not None and canary["phase"] == "promoted" else None

    after = wait_until(promoted, 60, "the canary promoted by controller b")
    assert after["started_at"] == before["started_at"], (before, after)  # the same run, not a new one
    said = [(e["kind"], e["object"], e["message"]) for e in get(b, "/api/v1/events?limit=1000")["events"]]
    assert after["replicas"] == before["replicas"], said

    def rolled() -> list[dict[str, Any]] | None:
        items = _ready(b, 2)
        return items if items and not any(r["stale_profile"] for r in items) else None

    final = wait_until(rolled, 60, "the roll finished by controller b")
    assert not {r["id"] for r in final} & {r["id"] for r in stable}
    assert len(_events(b, "canary_started")) == 1
    assert len(_events(b, "canary_promoted")) == 1


def test_a_failed_canary_stays_held_across_failover_and_a_crashed_stable_replica_comes_back_stable(
    pair: Pair,
) -> None:
    rollout = _canary("min_requests: 0, evals: [capitals], max_ttft_ratio: null", duration="30s")
    models = {"models/m.yaml": sim_model("m", 2, extra=rollout), "evals/capitals.yaml": EVAL}
    a, b, stable = _up(pair, models)
    stable_print = {r["fingerprint"] for r in stable}
    # New weights that still do not know their capitals: the eval suite fails the canary at once.
    pair.repo.write({"models/m.yaml": sim_model("m", 2, extra=rollout, args="decode_ms_per_token: 3")}, "try")

    def failed() -> dict[str, Any] | None:
        canary = _canary_status(a)
        return canary if canary is not None and canary["phase"] == "failed" else None

    verdict = wait_until(failed, 60, "the canary failed on leader a")
    wait_until(
        lambda: {r["id"] for r in _ready(a, 2) or []} == {r["id"] for r in stable}, 30, "the canary stopped"
    )
    _fail_over(a, b)
    held = wait_until(lambda: _ready(b, 2), 60, "the stable replicas adopted by controller b")
    assert {r["id"]: r["pid"] for r in held} == {r["id"]: r["pid"] for r in stable}

    # b takes its agents as soon as it leads, so the replicas can read ready a few store reads before it has
    # read the canary runs the last leader left: its status says `unknown` in that gap.
    def read() -> dict[str, Any] | None:
        canary = _canary_status(b)
        return canary if canary is not None and canary["phase"] != "unknown" else None

    kept = wait_until(read, 30, "controller b to have read the canary's run from the store")
    assert kept["phase"] == "failed", kept
    assert (kept["verdict"], kept["decided_at"]) == (verdict["verdict"], verdict["decided_at"])

    # A stable replica's engine dies while the model is held: it comes back as it was.
    crashed = stable[0]
    os.kill(crashed["pid"], signal.SIGKILL)

    def replaced() -> list[dict[str, Any]] | None:
        items = _ready(b, 2)
        return items if items and crashed["id"] not in {r["id"] for r in items} else None

    back = wait_until(replaced, 60, "the crashed stable replica replaced")
    assert {r["fingerprint"] for r in back} == stable_print, back
    starts = [
        e["message"] for e in _events(b, "replica_start") if e["object"] not in {r["id"] for r in stable}
    ]
    assert any("the stable profile" in m for m in starts), starts
    assert len(_events(b, "canary_started")) == 1, "a held model began a second canary"
