"""Several hosts on this machine: a network namespace per host, a switch (a bridge in a namespace of its own), a
veth pair from each host to the switch, and one from the test process (the root namespace) so tests reach every
host at its own address as an operator's laptop would.

Names: every namespace is `lh-<worker>-<pid>-<lab>-<role>` (the xdist worker, this pytest process's pid, a
counter), so two workers, two runs and two labs of one test never share one; the only interface in the root
namespace is the test's own end of a veth, `lh<pid hex>x<lab>` (15 characters at most, the kernel's limit). The
subnet (10.231.N.0/24) is picked under a lock among those no root-namespace address uses. Deleting the switch's
namespace deletes every veth of the lab (a veth dies with either end), so `close` (and the sweep of namespaces
whose pytest process is gone, `sweep_stale`) leaves nothing behind.

Partitions, without netem or iptables (neither is on a minimal Debian): `isolate` takes a host's switch port down
(cut from everyone, the test included), `cut(a, b)` adds blackhole routes to each other on both sides (those two
cannot talk; everyone else still can).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NS_PREFIX", "Lab", "ip", "namespaces", "sweep_stale"]

NS_PREFIX = "lh-"
_NS_NAME = re.compile(r"^lh-(?P<worker>[A-Za-z0-9]+)-(?P<pid>\d+)-(?P<lab>\d+)-(?P<role>[a-z0-9]+)$")
_SUBNET_LOCK = Path("/run/llmgw-hosts-subnets.lock")
_SUBNETS = range(1, 255)  # N of 10.231.N.0/24
_labs = itertools.count(1)


def ip(*args: str, netns: str | None = None) -> str:
    """Run iproute2's `ip` (in `netns` when given); its output. A failure raises with what it said."""
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """Every named network namespace on the machine (`ip netns list` prints `name (id: N)`)."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete the lab namespaces whose pytest process is gone (a run killed before its finalizer), killing what
    still runs in them first; the names deleted. A live process's labs, another run's or worker's, are left alone."""
    gone = []
    for name in namespaces():
        m = _NS_NAME.match(name)
        if m and not _pid_alive(int(m["pid"])):
            with contextlib.suppress(RuntimeError):
                for pid in ip("netns", "pids", name).split():  # the dead run's hosts' processes, power off
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                ip("netns", "delete", name)
                gone.append(name)
    return gone


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    with _SUBNET_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _used_subnets() -> set[int]:
    used = set()
    for m in re.finditer(r"inet 10\.231\.(\d+)\.", ip("-4", "-o", "addr", "show")):
        used.add(int(m[1]))
    return used


@dataclass
class Lab:
    """One lab's network: the switch, the test's own port on it, and the hosts added so far."""

    worker: str
    owner: int = field(default_factory=os.getpid)  # the pytest process the lab belongs to (its names say so)
    lab: int = field(default_factory=lambda: next(_labs))
    subnet: int = 0
    hosts: dict[str, str] = field(default_factory=dict)  # host name: its namespace
    addresses: dict[str, str] = field(default_factory=dict)  # host name: its address
    ports: dict[str, str] = field(default_factory=dict)  # host name: its port (veth end) on the switch

    def ns_name(self, role: str) -> str:
        return f"{NS_PREFIX}{self.worker}-{self.owner}-{self.lab}-{role}"

    @property
    def switch(self) -> str:
        return self.ns_name("sw")

    @property
    def root_port(self) -> str:
        return f"lh{self.owner:x}x{self.lab}"

    @property
    def test_address(self) -> str:
        return f"10.231.{self.subnet}.1"

    def open(self) -> Lab:
        ip("netns", "add", self.switch)
        ip("link", "add", "name", "br0", "type", "bridge", netns=self.switch)
        ip("link", "set", "br0", "up", netns=self.switch)
        with _subnet_lock():
            free = sorted(set(_SUBNETS) - _used_subnets())
            if not free:
                raise RuntimeError("no free 10.231.N.0/24 subnet for a host lab: every one is in use")
            self.subnet = free[0]
            ip(
                "link",
                "add",
                "name",
                self.root_port,
                "type",
                "veth",
                "peer",
                "name",
                "root",
                "netns",
                self.switch,
            )
            ip("addr", "add", f"{self.test_address}/24", "dev", self.root_port)
        ip("link", "set", self.root_port, "up")
        ip("link", "set", "root", "master", "br0", "up", netns=self.switch)
        return self

    def add_host(self, name: str) -> str:
        """A host's namespace wired to the switch, with the next address; its namespace name."""
        if not re.fullmatch(r"[a-z][a-z0-9]{0,9}", name):
            raise ValueError(f"host name {name!r}: want a lowercase letter then up to 9 letters or digits")
        ns = self.ns_name(name)
        address = f"10.231.{self.subnet}.{len(self.hosts) + 10}"
        ip("netns", "add", ns)
        port = f"p{len(self.hosts)}"
        ip(
            "link",
            "add",
            "name",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns,
            netns=self.switch,
        )
        ip("link", "set", port, "master", "br0", "up", netns=self.switch)
        ip("link", "set", "lo", "up", netns=ns)
        ip("addr", "add", f"{address}/24", "dev", "eth0", netns=ns)
        ip("link", "set", "eth0", "up", netns=ns)
        self.hosts[name], self.addresses[name], self.ports[name] = ns, address, port
        return ns

    # ------------------------------------------------------------------------------------ partitions

    def isolate(self, name: str) -> None:
        """Take `name`'s switch port down: it reaches nobody and nobody reaches it."""
        ip("link", "set", self.ports[name], "down", netns=self.switch)

    def rejoin(self, name: str) -> None:
        ip("link", "set", self.ports[name], "up", netns=self.switch)

    def cut(self, a: str, b: str) -> None:
        """`a` and `b` cannot reach each other (packets dropped both ways, silently, as a lost link does)."""
        ip("route", "add", "blackhole", f"{self.addresses[b]}/32", netns=self.hosts[a])
        ip("route", "add", "blackhole", f"{self.addresses[a]}/32", netns=self.hosts[b])

    def heal(self, a: str, b: str) -> None:
        ip("route", "del", "blackhole", f"{self.addresses[b]}/32", netns=self.hosts[a])
        ip("route", "del", "blackhole", f"{self.addresses[a]}/32", netns=self.hosts[b])

    def close(self) -> None:
        """Delete every namespace of the lab (the switch last: its veths take the hosts' ends with them)."""
        for ns in [*self.hosts.values(), self.switch]:
            with contextlib.suppress(RuntimeError):
                ip("netns", "delete", ns)
        with contextlib.suppress(RuntimeError):
            ip("link", "delete", self.root_port)  # normally gone with the switch already
