"""A host of the lab: its network namespace, its own PID, mount and UTS namespaces (an init process is PID 1 of
them), and a directory of its own (its disk: state directories, logs, configuration). Every process of the host
is started inside them (`nsenter` into the init's namespaces), so `power_off` (SIGKILL to the init) kills every
process of the host at once, engines an agent left behind included, as pulling the plug does; `boot` starts a new
init, and what the host keeps is what is on its disk.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from support import wait_until

__all__ = ["Host", "HostProc"]

# PID 1 of a host: reaps the orphans it inherits (an agent's engines when the agent dies), forever. SIGKILL from
# the parent namespace is the only signal that can stop a namespace's init without a handler: the power cord.
_INIT = "import os, signal\nsignal.signal(signal.SIGCHLD, lambda *_: None)\nwhile True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        signal.pause()\n"


@dataclass
class HostProc:
    """A process started on a host (the `nsenter` in this namespace that waits for it): `stop` is SIGTERM to
    its process group on the host, then SIGKILL."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, wait_s: float = 20.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Host:
    name: str
    netns: str
    address: str
    disk: Path
    init: subprocess.Popen[bytes] | None = None
    procs: list[HostProc] = field(default_factory=list)
    boots: int = 0

    @property
    def init_pid(self) -> int:
        """PID 1 of the host, as this namespace sees it: the child `unshare --fork` made."""
        assert self.init is not None, f"host {self.name} is off"
        children = Path(f"/proc/{self.init.pid}/task/{self.init.pid}/children").read_text().split()
        assert children, f"host {self.name}: unshare has no child yet"
        return int(children[0])

    def boot(self) -> Host:
        """Power on: a new PID namespace whose init is PID 1, its own hostname."""
        self.disk.mkdir(parents=True, exist_ok=True)
        self.boots += 1
        argv = [
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--uts",
            "--kill-child",
            "sh",
            "-c",
            'hostname "$1" && exec "$2" -c "$3"',
            "init",
            self.name,
            sys.executable,
            _INIT,
        ]
        with (self.disk / "init.log").open("ab") as log:
            self.init = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)

        def up() -> bool:
            try:
                cmdline = Path(f"/proc/{self.init_pid}/cmdline").read_bytes()
            except (AssertionError, OSError):
                return False
            return b"os.wait" in cmdline  # the exec happened: the hostname is set

        wait_until(up, 15, f"host {self.name} to boot")
        return self

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> HostProc:
        """`argv` as a process of this host (its network, PIDs, mounts, hostname), logging to its disk."""
        enter = ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "-u", "--"]
        log = self.disk / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [*enter, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        p = HostProc(name, proc, log)
        self.procs.append(p)
        return p

    def run(self, argv: list[str], timeout: float = 30.0) -> str:
        """A short command on the host; its output (raises on failure)."""
        enter = ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "-u", "--"]
        done = subprocess.run([*enter, *argv], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"on {self.name}: {argv} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def pids(self) -> list[int]:
        """Every process of the host but its init, as the host numbers them (its own /proc)."""
        listing = "import os; print(*(p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())))"
        return sorted(int(p) for p in self.run([sys.executable, "-c", listing]).split())

    def power_off(self) -> None:
        """Pull the plug: SIGKILL to PID 1 kills every process of the host; nothing gets to clean up."""
        if self.init is None:
            return
        with contextlib.suppress(ProcessLookupError, AssertionError, OSError):
            os.kill(self.init_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.init.pid, signal.SIGKILL)
        self.init.wait(20)
        for p in self.procs:
            p.proc.wait(20)  # each nsenter returns once its process (killed with the namespace) is gone
        self.procs.clear()
        self.init = None

    @property
    def on(self) -> bool:
        return self.init is not None and self.init.poll() is None
