"""One `llmgw up` subprocess as a newcomer runs it (a real process on the ports it is given, its own session,
its state dir in a temporary directory) and what it printed: shared by the end-to-end test of `up` and the
client suite (tests/clients), each starting its own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cluster-repo"
# What a test's own repo for `up` holds beside its Cluster, Models and Projects: the local node `up` runs its
# agent as, and an organization `org` for the projects.
LOCAL_NODE_AND_ORG = """---
apiVersion: llmgw/v1
kind: Node
metadata: {name: local}
spec: {local: true}
---
apiVersion: llmgw/v1
kind: Organization
metadata: {name: org}
spec: {}
"""
START_S = 60.0  # up to the printed key (controller, router, key; no model needed)
STOP_S = 60.0  # engines get a 10 s grace each, the agent 15 s


def llmgw_command() -> list[str]:
    script = Path(sys.executable).parent / "llmgw"
    return (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from llmgw.cli.main import main; main()"]
    )


@dataclass
class Up:
    """One `llmgw up` subprocess and what it printed."""

    tmp: Path
    ports: dict[str, int]
    llamacpp: bool = True
    repo: Path = EXAMPLE
    engine_ports: str | None = None  # `--engine-ports LO-HI`; None: the agent's default range
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)
    runs: int = 0

    def __post_init__(self) -> None:
        self.log = self.tmp / "up.out"

    @property
    def state_dir(self) -> Path:
        return self.tmp / ".llmgw"  # the default, in the working directory: what `make up` does

    def start(self) -> None:
        self.runs += 1
        self.log = self.tmp / f"up-{self.runs}.out"
        argv = [
            *llmgw_command(),
            "up",
            str(self.repo),
            "--router-listen",
            f"127.0.0.1:{self.ports['router']}",
            "--router-metrics-listen",
            f"127.0.0.1:{self.ports['router_metrics']}",
            "--controller-listen",
            f"127.0.0.1:{self.ports['controller']}",
            "--controller-metrics-listen",
            f"127.0.0.1:{self.ports['controller_metrics']}",
        ]
        if not self.llamacpp:
            argv.append("--no-llamacpp")
        if self.engine_ports is not None:
            argv += ["--engine-ports", self.engine_ports]
        with self.log.open("wb") as out:
            # Its own session, as a terminal would give it: the test can check its whole process group.
            self.proc = subprocess.Popen(
                argv, cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def printed(self, pattern: str, limit_s: float, what: str) -> re.Match[str]:
        def find() -> re.Match[str] | None:
            stopped = not self.running()  # read before the output: what it printed before it exited counts
            found = re.search(pattern, self.output(), re.MULTILINE)
            if found is None and stopped:
                raise AssertionError(f"llmgw up exited ({self.proc and self.proc.returncode})")
            return found

        try:
            return wait_until(find, limit_s, what)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n--- llmgw up printed:\n{self.output()}\n--- agent log:\n{self.agent_log()}"
            ) from None

    def agent_log(self) -> str:
        path = self.state_dir / "agent" / "agent.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-40:]) if path.exists() else ""

    def engine_records(self) -> list[dict[str, Any]]:
        return [
            json.loads(p.read_text()) for p in sorted((self.state_dir / "agent" / "shards").glob("*.json"))
        ]

    def interrupt(self, sig: int = signal.SIGINT) -> int:
        """SIGINT (as Ctrl-C sends it) or SIGTERM, and wait for the exit code."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"llmgw up did not stop within {STOP_S}s of SIGINT:\n{self.output()}"
            ) from None

    def kill_everything(self) -> None:
        """Teardown when a test failed half-way: nothing of this run may outlive the module."""
        groups = {int(r["pgid"]) for r in self.engine_records() if r.get("pgid")}
        if self.proc is not None:
            groups.add(self.proc.pid)
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(timeout=STOP_S)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        agent = re.search(r"^agent: node \S+, pid (\d+)", self.output(), re.MULTILINE)
        if agent:
            groups.add(int(agent.group(1)))
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


def admin_call(up: Up, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """The controller's admin API of `up`, with the admin token `up` wrote: (status, the JSON answer)."""
    token = (up.state_dir / "controller" / "admin-token").read_text().strip()
    ask = urllib.request.Request(
        f"http://127.0.0.1:{up.ports['controller']}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(ask, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@dataclass(frozen=True)
class Printed:
    base_url: str
    key: str
    agent_pid: int


def printed(up: Up) -> Printed:
    base = up.printed(r"^OpenAI base URL: (\S+)$", START_S, "the printed base URL")
    key = up.printed(r"^API key \(project playground\): (sk-llmgw-\S+)$", START_S, "the printed key")
    agent = up.printed(r"^agent: node local, pid (\d+)", START_S, "the agent line")
    return Printed(base.group(1), key.group(1), int(agent.group(1)))
