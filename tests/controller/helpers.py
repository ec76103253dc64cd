"""Helpers for the controller tests: a cluster repo on disk (plain or git), a controller in this process,
and agents as real processes (waiting with deadlines is `support.wait_for`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import git
from support import free_port_range

from llmgw.controller.app import RunningController, start_controller
from llmgw.controller.parts.settings import ControllerOptions

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: test}
spec:
  controller:
    heartbeat_interval: 200ms
    unreachable_after: %(unreachable)s
    lost_after: %(lost)s
    resync_interval: 1s
"""


def model_yaml(name: str, min_: int = 2, max_: int | None = None, cores: int = 1, extra: str = "") -> str:
    if min_ == 0 and "idle_timeout" not in extra:
        extra = "\n  scaling_placeholder" + extra
    text = f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  context_length: 4096
  scaling: {{min: {min_}, max: {max_ if max_ is not None else max(min_, 1)}}}{extra}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: {cores}, args: {{decode_ms_per_token: 1}}}}
"""
    return text.replace("}\n  scaling_placeholder", ", idle_timeout: 10m}")


def cluster_yaml(unreachable: str = "2s", lost: str = "4s") -> str:
    return CLUSTER % {"unreachable": unreachable, "lost": lost}


class Repo:
    """A cluster repo in a directory; `git=True` makes it a git repository the test commits to."""

    def __init__(self, path: Path, use_git: bool) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.git = git.Repo.init(path, initial_branch="main") if use_git else None
        if self.git is not None:
            with self.git.config_writer() as cw:
                cw.set_value("user", "name", "test")
                cw.set_value("user", "email", "test@example.invalid")

    def write(self, files: dict[str, str | None], message: str = "change") -> str:
        """Write (None deletes) files; with git, commit them and return the SHA."""
        for rel, text in files.items():
            target = self.path / rel
            if text is None:
                target.unlink(missing_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                # Whole or not at all, as an editor's save or a checkout lands: a directory source polling
                # meanwhile must never read a half-written file and apply it as a revision of its own.
                partial = target.with_name(f".{target.name}.partial")
                partial.write_text(text)
                os.replace(partial, target)
        if self.git is None:
            return ""
        self.git.git.add("-A")
        self.git.index.commit(message)
        sha = self.git.head.commit.hexsha
        # Reading objects starts GitPython's persistent `git cat-file` processes, which an open Repo keeps
        # running until it is collected (a test's fixture may hold it to the end of the worker). Closed
        # now; the next commit starts them again.
        self.git.close()
        return sha


class Admin:
    """The admin API of a running controller."""

    def __init__(self, running: RunningController) -> None:
        self.running = running
        self.url = running.url
        self.headers = {"Authorization": f"Bearer {running.admin_token}"}

    async def get(self, path: str) -> Any:
        async with aiohttp.ClientSession() as s, s.get(self.url + path, headers=self.headers) as r:
            assert r.status == 200, f"GET {path}: {r.status} {await r.text()}"
            return await r.json()

    async def post(self, path: str, body: Any = None, expect: int | None = None) -> Any:
        async with (
            aiohttp.ClientSession() as s,
            s.post(self.url + path, json=body, headers=self.headers) as r,
        ):
            if expect is not None:
                assert r.status == expect, f"POST {path}: {r.status} {await r.text()}"
            return await r.json()

    async def replicas(self, model: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        items = (await self.get("/api/v1/replicas"))["replicas"]
        return [r for r in items if model in (None, r["model"]) and state in (None, r["state"])]

    async def node_state(self, name: str) -> str | None:
        nodes = (await self.get("/api/v1/nodes"))["nodes"]
        return next((n["state"] for n in nodes if n["name"] == name), None)

    async def metrics(self) -> str:
        assert self.running.metrics_url is not None
        async with aiohttp.ClientSession() as s, s.get(self.running.metrics_url + "/metrics") as r:
            return await r.text()


def settings_for(tmp: Path, repo: Path, **extra: Any) -> ControllerOptions:
    token = tmp / "token"
    token.write_text("test-token\n")
    values: dict[str, Any] = {
        "repo": str(repo),
        "poll_s": 0.3,
        "dir_poll_s": 0.2,
        "store": f"sqlite:///{tmp / 'controller.db'}",
        "listen": "127.0.0.1:0",
        "metrics_listen": "127.0.0.1:0",
        "admin_token_file": token,
        "state_dir": tmp / "controller-state",
        "secrets_dir": tmp / "secrets",  # the repo's {file: NAME} secrets: outside the repo, as in production
        "command_timeout_s": 10.0,
        "drain_s": 0.3,
        "backoff_base_s": 0.5,
        # A test's webhooks come seconds apart at most; the 5 s default would make each one wait.
        "webhook_min_interval_s": 0.2,
    }
    values.update(extra)
    return ControllerOptions(**values)


async def start(settings: ControllerOptions) -> tuple[RunningController, Admin]:
    running = await start_controller(settings)
    return running, Admin(running)


class Agents:
    """Agent daemons as real processes, each its own node (state dir, inventory override, port range).

    Engines outlive agents by design; cleanup kills every engine group an agent recorded.
    """

    def __init__(self, tmp: Path, token_file: Path) -> None:
        self.tmp = tmp
        self.token_file = token_file
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port_blocks: dict[str, int] = {}  # node: the first of its agent's 100 engine ports
        self.count = 0

    def start(
        self,
        node: str,
        controller_url: str | list[str],
        cpu_cores: int = 4,
        extra: dict[str, Any] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start node `node`'s agent; a list of controller addresses is tried in turn (a leader and standbys).
        `extra`: more keys of the agent's configuration (engines, ...)."""
        base = self.tmp / "agents" / node
        base.mkdir(parents=True, exist_ok=True)
        override = base / "inventory.json"
        override.write_text(json.dumps({"cpu_cores": cpu_cores, "memory_bytes": 16 * 1024**3, "gpus": []}))
        lo, hi = self.port_range(node)
        cfg = {
            "node": node,
            "controllers": [controller_url] if isinstance(controller_url, str) else list(controller_url),
            "token_file": str(self.token_file),
            "state_dir": str(base / "state"),
            "advertise_host": "127.0.0.1",
            "bind_host": "127.0.0.1",
            "port_range": [lo, hi],
            "inventory_override": str(override),
            "ready_timeout_s": 60,
            "stop_grace_s": 3,
            "max_backoff_s": 0.5,
            **(extra or {}),
        }
        path = base / "agent.json"
        path.write_text(json.dumps(cfg))
        self.count += 1
        log = (base / f"agent-{self.count}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw_agent.main", "run", "--config", str(path)],
            stdout=log,
            stderr=log,
        )
        log.close()  # the child holds its own descriptor
        self.procs[node] = proc
        return proc

    def port_range(self, node: str) -> tuple[int, int]:
        """Engine ports for `node`'s agent: a block of 100 of this worker's ports, the same one when the node's
        agent is restarted (its engines keep theirs)."""
        if node not in self.port_blocks:
            self.port_blocks[node] = free_port_range(100)
        lo = self.port_blocks[node]
        return lo, lo + 99

    def stop(self, node: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs[node]
        if proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=20)

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for record in (self.tmp / "agents").glob("*/state/shards/*.json"):
            with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
                pgid = int(json.loads(record.read_text())["pgid"])
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)


async def status_if_applied(admin: Admin, revision: str) -> Any:
    """The controller's status once it has applied `revision`, else None (for wait_for)."""
    status = await admin.get("/api/v1/status")
    return status if status["applied"] and status["applied"]["revision"] == revision else None


async def status_if_refused(admin: Admin, revision: str) -> Any:
    """The controller's status once it has refused `revision`, else None (for wait_for)."""
    status = await admin.get("/api/v1/status")
    return status if status["refused"] and status["refused"]["revision"] == revision else None
