"""An engine's process as the agent sees it: /proc (its start time, its environment), its process group, its
output file, the environment it starts with, how its exit is told.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from llmgw_agent import repo_rules
from llmgw_agent.protocol import ShardSpec

__all__ = [
    "OUTPUT_FILE",
    "OUTPUT_LINES",
    "describe_exit",
    "engine_environment",
    "group_alive",
    "head_lines",
    "proc_environ",
    "proc_start_time",
    "redact_argv",
    "tail_lines",
]

log = logging.getLogger("llmgw_agent.supervisor")  # the supervisor's lines, as before the split
OUTPUT_LINES = 50
OUTPUT_FILE = "output.log"


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None when there is no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None  # a zombie has exited
    return int(fields[19])


def proc_environ(pid: int) -> dict[str, str]:
    """The environment a process started with (/proc/PID/environ), or {} when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tail_lines(path: Path, count: int = OUTPUT_LINES) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 64 * 1024, 0))
            data = f.read()
    except FileNotFoundError:
        return []
    return [line.decode("utf-8", "replace") for line in data.splitlines()[-count:]]


def head_lines(path: Path, limit_bytes: int = 256 * 1024) -> list[str]:
    """The first lines of an output file: where engines say what they found at start."""
    try:
        with path.open("rb") as f:
            data = f.read(limit_bytes)
    except FileNotFoundError:
        return []
    return [line.decode("utf-8", "replace") for line in data.splitlines()]


# What an engine inherits from the agent: enough to find executables and decode text, nothing else (the agent's
# own environment may hold its token path, proxies or a PYTHONPATH that is nobody else's business).
_INHERITED = ("PATH", "LANG", "LC_ALL")


def engine_environment(spec: ShardSpec, own: dict[str, str]) -> dict[str, str]:
    """The environment an engine starts with: the inherited minimum, the profile's env filtered again through
    the allowlist `llmgw validate` applies (a spec may come from a controller that did not), then what the
    agent sets itself (key, GPUs), which no profile can override."""
    kept, dropped = repo_rules.filter_env(spec.engine, spec.env)
    if dropped:
        log.warning(
            "shard %s: dropped environment %s (%s)",
            spec.shard_id,
            ", ".join(dropped),
            "; ".join(p for n in dropped if (p := repo_rules.env_name_problem(spec.engine, n))),
        )
    base = {k: os.environ[k] for k in _INHERITED if k in os.environ}
    return {**base, **kept, **own}


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def redact_argv(argv: list[str], secret: str | None) -> list[str]:
    return [("***" if secret and a == secret else a) for a in argv]
