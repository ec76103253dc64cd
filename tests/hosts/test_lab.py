"""The lab itself: hosts that are really apart (own address, hostname, sshd, processes), partitions that cut
what they say and nothing else, a power-off that leaves no process of the host, and nothing left afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import pid_alive, wait_until, worker_name

from hosts.lab import HostLab
from hosts.machine import Host
from hosts.net import Lab, namespaces, sweep_stale

pytestmark = [pytest.mark.hosts, pytest.mark.ssh]

PROBE = "import socket, sys; socket.create_connection((sys.argv[1], 22), timeout=1).close()"


def reaches(lab: HostLab, src: str, dst: str) -> bool:
    """Whether a process on host `src` can open a TCP connection to `dst`'s sshd."""
    try:
        lab.hosts[src].run([sys.executable, "-c", PROBE, lab.hosts[dst].address], timeout=10)
    except RuntimeError:
        return False
    return True


def test_hosts_are_apart_partitions_cut_and_power_off_kills_all(lab: HostLab) -> None:
    for name in ("a", "b", "c"):
        lab.add_host(name)
        lab.start_sshd(name)
    addresses = {h.address for h in lab.hosts.values()}
    assert len(addresses) == 3

    def ssh_hostname(name: str) -> str | None:
        done = subprocess.run(lab.ssh_argv(name, "hostname"), capture_output=True, text=True, timeout=20)
        return done.stdout.strip() if done.returncode == 0 else None

    # Each sshd answers on its host's address and logs in to that host (its own hostname).
    for name in ("a", "b", "c"):
        assert wait_until(lambda n=name: ssh_hostname(n), 20, f"ssh to {name}") == name  # type: ignore[misc]
    # A host sees only its own processes: the sshd processes a sees all run a's configuration.
    seen = [_cmdline(lab, "a", p) for p in lab.hosts["a"].pids()]
    sshd = [cmd for cmd in seen if "sshd" in cmd]
    assert sshd and all(str(lab.hosts["a"].disk) in cmd for cmd in sshd), seen

    # cut(a, b): those two cannot talk; c reaches both and the test reaches all.
    assert reaches(lab, "a", "b") and reaches(lab, "a", "c")
    lab.net.cut("a", "b")
    assert not reaches(lab, "a", "b") and not reaches(lab, "b", "a")
    assert reaches(lab, "a", "c") and reaches(lab, "c", "b")
    lab.net.heal("a", "b")
    assert reaches(lab, "a", "b")
    # isolate(c): nobody reaches it, the test neither; back once the link is up.
    lab.net.isolate("c")
    assert not reaches(lab, "a", "c") and ssh_hostname("c") is None
    lab.net.rejoin("c")
    assert wait_until(lambda: ssh_hostname("c"), 20, "ssh to c after rejoin") == "c"

    # Power off: every process of b is gone at once (its sshd and a process it left running in its own session).
    b = lab.hosts["b"]
    orphan = b.start("orphan", ["setsid", "-f", sys.executable, "-c", "import time; time.sleep(600)"])
    wait_until(lambda: len(b.pids()) >= 2 and not orphan.alive(), 20, "b's orphan detached")
    lab.reboot("b")
    assert b.pids() == [], "a booted host runs nothing it was not told to start"
    assert ssh_hostname("b") is None
    lab.start_sshd("b")
    assert wait_until(lambda: ssh_hostname("b"), 20, "ssh to b after its reboot") == "b"


def _cmdline(lab: HostLab, host: str, pid: int) -> str:
    return lab.hosts[host].run(["cat", f"/proc/{pid}/cmdline"]).replace("\0", " ")


def test_the_lab_leaves_no_namespace(lab: HostLab) -> None:
    lab.add_host("a")
    made = [lab.net.switch, *lab.net.hosts.values()]
    assert set(made) <= set(namespaces())
    lab.close()
    assert not set(made) & set(namespaces())


def test_a_dead_runs_lab_is_swept_with_its_processes(tmp_path: Path) -> None:
    """A lab whose pytest process is gone (killed before its teardown): the sweep kills its hosts' processes
    and deletes its namespaces; a live process's lab is left alone.

    Every worker sweeps when its first host test starts, so another worker may sweep this dead lab first: the
    owner dies only once the lab is built, and what is checked is that the lab is gone, whoever swept it."""
    if os.geteuid() != 0:
        pytest.skip("the host lab makes network namespaces: run tests/hosts as root")
    owner = subprocess.Popen(["sleep", "600"])  # the run that dies: alive while its lab is built
    lab = Lab(worker_name(), owner=owner.pid).open()
    try:
        ns = lab.add_host("a")
        host = Host("a", ns, lab.addresses["a"], tmp_path / "a").boot()
        assert host.init is not None
        init = host.init_pid
        alive = Lab(worker_name()).open()  # this process's: kept
        try:
            owner.kill()
            owner.wait()  # its pid now names no process (reused only after the kernel wraps round)
            swept = sweep_stale()
            assert not {lab.switch, ns} & set(namespaces()), swept
            assert not set(swept) & set(namespaces())
            wait_until(lambda: not pid_alive(init), 10, "the dead run's host init killed")
            assert alive.switch in namespaces()
        finally:
            alive.close()
        host.init.wait(10)
    finally:
        owner.kill()
        owner.wait()
        lab.close()
