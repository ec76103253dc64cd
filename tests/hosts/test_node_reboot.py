"""Fault: a node's host "rebooted": PID 1 of its PID namespace killed, so every process of the host dies at once
(sshd, agent, engines: nothing gets to clean up), then booted and its services started again from the state
directory on its own disk.

Must hold: nothing of the host survives the power-off; the agent comes back with its state directory, the node is
Ready again at once knowing its replica is gone (a `replica_vanished` event, not a minute of waiting for a
start never reported) and the model has its replicas back (on the rebooted node: the other has no room), one per node, not
one more. Must not be lost: the other node's replica (same id, same engine process); the rebooted node's engine
is a new process (the old one died with its host), never two.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from controller.helpers import model_yaml
from support import wait_until

from hosts.lab import HostLab
from llmgw.controller.status.fleet import PENDING_GRACE_S

pytestmark = [pytest.mark.hosts, pytest.mark.postgres, pytest.mark.ssh]


def test_node_rebooted_comes_back_from_its_own_state_directory(lab: HostLab) -> None:
    for name in ("db", "ca", "n1", "n2"):
        lab.add_host(name)
    lab.start_postgres("db")
    lab.cluster(unreachable="2s", lost="300s")
    lab.start_controller("ca")
    wait_until(lambda: lab.role("ca") == "leader", 30, "ca to lead")
    for node in ("n1", "n2"):
        lab.start_sshd(node)
        lab.start_agent(node, ["ca"])
    lab.repo.write({"models/a.yaml": model_yaml("sim-a", min_=2, cores=3)}, "add sim-a")
    before = wait_until(lambda: lab.ready("ca", "sim-a", 2), 90, "two replicas of sim-a ready")
    on_n2 = {rid: where for rid, where in before.items() if where[0] == "n2"}
    assert len(on_n2) == 1
    n1 = lab.hosts["n1"]
    running = n1.pids()
    assert len(running) >= 3, f"n1 runs its sshd, agent and engine: {running}"
    state = n1.disk / "agent-state"
    assert state.is_dir()

    rebooted_at = time.time()
    lab.reboot("n1")
    assert n1.pids() == [], "nothing of n1 survived its power-off"
    ssh = subprocess.run(lab.ssh_argv("n1", "true"), capture_output=True, timeout=20)
    assert ssh.returncode != 0, "n1's sshd died with it"
    wait_until(lambda: lab.node_state("ca", "n1") == "Unreachable", 30, "n1 Unreachable while down")

    lab.start_sshd("n1")
    lab.start_agent("n1", ["ca"])  # the same configuration and state directory, on the host's disk
    wait_until(lambda: lab.node_state("ca", "n1") == "Ready", 60, "n1 Ready after its reboot")
    # Well inside the grace a start not yet reported gets (PENDING_GRACE_S, 60 s): the controller knows at the
    # registration that the replica is gone, it does not wait for it.
    assert PENDING_GRACE_S >= 60
    after = wait_until(lambda: lab.ready("ca", "sim-a", 2), 40, "two replicas of sim-a ready again")
    vanished = [e for e in lab.events("ca", rebooted_at) if e["kind"] == "replica_vanished"]
    assert [e["object"] for e in vanished] == [rid for rid, w in before.items() if w[0] == "n1"], vanished
    assert {rid: w for rid, w in after.items() if w[0] == "n2"} == on_n2, "n2's replica untouched"
    assert sorted(node for node, _ in after.values()) == ["n1", "n2"]
    engines = [p for p in n1.pids() if "engine" in _cmdline(lab, "n1", p) or "sim" in _cmdline(lab, "n1", p)]
    assert len(engines) >= 1, "n1 runs its engine again"
    assert (
        wait_until(
            lambda: subprocess.run(
                lab.ssh_argv("n1", "hostname"), capture_output=True, text=True
            ).stdout.strip(),
            20,
            "ssh to n1 after its reboot",
        )
        == "n1"
    )


def _cmdline(lab: HostLab, host: str, pid: int) -> str:
    try:
        return lab.hosts[host].run(["cat", f"/proc/{pid}/cmdline"]).replace("\0", " ")
    except RuntimeError:
        return ""  # gone meanwhile
