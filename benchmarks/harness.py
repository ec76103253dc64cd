"""What the benchmarks share: ports, waiting for a server, the processes they start, and what those cost.

CPU and memory are read from /proc for a whole process tree (the process and every descendant), because a
router may run as several worker processes and a peer may fork helpers; a tree's CPU also counts the children
it has already reaped (cutime, cstime), so a worker that exits mid-run is not lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CLOCK_TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# Every port free_ports handed out in this process: the kernel may hand the same free port to two binds in a
# row (seen: a router's --listen and --metrics-listen the same), and a port told to a process that has not
# bound it yet is still free to the kernel.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now and never handed out before in this process."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports, free now (each held bound until all are found) and never handed out
    before in this process: for a process listening on several, or processes started before any binds."""
    found: list[int] = []
    with contextlib.ExitStack() as stack:
        for _ in range(count + 1000):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))  # held: the kernel will not hand it out again meanwhile
            port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                found.append(port)
                if len(found) == count:
                    _HANDED_OUT.update(found)
                    return found
    raise RuntimeError(f"no {count} fresh loopback ports after {count + 1000} binds")


def wait_http(
    url: str,
    limit_s: float = 120.0,
    headers: dict[str, str] | None = None,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process serving {url} exited with {proc.returncode}")
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:  # it answers: listening (a 404 from a server without that path is fine)
                return
            time.sleep(0.2)
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {limit_s:g} s")


def _stat_fields(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def tree_pids(root: int) -> list[int]:
    """root and every live descendant (by parent pid), root first; [] once root is gone."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry))[1])
        except (OSError, IndexError, ValueError):
            continue  # exited between listdir and read
        children.setdefault(ppid, []).append(int(entry))
    if not Path(f"/proc/{root}").exists():
        return []
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of root's tree so far, reaped children included."""
    total = 0
    for i, pid in enumerate(tree_pids(root)):
        try:
            f = _stat_fields(pid)
        except OSError:
            continue
        total += int(f[11]) + int(f[12])  # utime, stime
        if i == 0:
            total += int(f[13]) + int(f[14])  # cutime, cstime: children root has waited for
    return total / CLOCK_TICK


def tree_rss_bytes(root: int, pids: list[int] | None = None) -> int:
    """Resident memory of root's tree (the sum of each process's RSS; shared pages count once per process).

    pids, when given, is the tree found earlier: reading only their statm takes microseconds, where walking
    /proc takes milliseconds that would delay whatever else the caller's event loop is timing."""
    total = 0
    for pid in pids if pids is not None else tree_pids(root):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def raise_fd_limit(need: int) -> int:
    """Raise this process's open-file limit (children inherit it) to the hard limit; say so if short of need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        print(
            f"open-file limit {target} is below the {need} this run needs: raise the hard limit (ulimit -Hn)"
        )
    return target


def pinned(argv: list[str], cpus: str | None) -> list[str]:
    """argv run on the given CPUs (taskset execs the command, so the pid stays the command's)."""
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def start_snapshot_router(
    procs: Procs, path: Path, snapshot: dict[str, Any]
) -> tuple[str, subprocess.Popen[bytes]]:
    """An llmgw-router serving a static `snapshot` (written to `path`; its `router.listen` and
    `router.metrics_listen` are where it listens) with `--no-auth`, once it answers /v1/models: its address and
    process."""
    path.write_text(json.dumps(snapshot, indent=1))
    listen, metrics = str(snapshot["router"]["listen"]), str(snapshot["router"]["metrics_listen"])
    argv = [sys.executable, "-m", "llmgw_router", "--snapshot", str(path), "--no-auth"]
    argv += ["--listen", listen, "--metrics-listen", metrics, "--log-level", "WARNING"]
    proc = procs.start(argv)
    url = f"http://{listen}"
    wait_http(url + "/v1/models", 60)
    return url, proc


def interrupt_on_sigterm() -> None:
    """SIGTERM ends the benchmark as Ctrl-C does, so its `finally` stops the engines it started in sessions of
    their own (killing the benchmark's process group would otherwise leave them running)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


class Procs:
    def __init__(self, logs: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = logs

    def start(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        cpus: str | None = None,
    ) -> subprocess.Popen[bytes]:
        # Output to a file, never a pipe nobody reads: a full pipe would stall the process mid-benchmark.
        with open(self.log_path(len(self.procs)), "wb") as log:
            p = subprocess.Popen(
                pinned(argv, cpus),
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(p)
        return p

    def log_path(self, index: int) -> Path:
        return self.logs / f"proc-{index}.log"

    def log_tail(self, proc: subprocess.Popen[bytes], lines: int = 3) -> str:
        path = self.log_path(self.procs.index(proc))
        text = path.read_text(errors="replace").strip() if path.exists() else ""
        return " | ".join(text.splitlines()[-lines:])

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
