"""`llmgw engine-check NODE ENGINE`: run an engine's version (or help) on a node and show what it says.

The command for each engine is a pure function of the Cluster's engines section (a `path` there wins over the
name looked up on PATH), so the controller and the CLI ask the same question.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.adapters.ssh.remote import Remote, SshTarget, StepFailed, connect
from llmgw.adapters.ssh.render import Layout
from llmgw.core.config.models import EngineSettings

# The executable looked up on PATH when the Cluster names no path, and what to ask it.
_DEFAULTS: dict[str, tuple[str, str]] = {
    "llamacpp": ("llama-server", "--version"),
    "vllm": ("vllm", "--version"),
    "sglang": ("python3", "-c 'import sglang; print(\"sglang\", sglang.__version__)'"),
    "trtllm": ("trtllm-serve", "--help"),
}


@dataclass(frozen=True)
class EngineCheck:
    node: str
    engine: str
    command: str
    ok: bool
    output: str


def engine_command(engine: str, settings: EngineSettings | None, agent_command: str) -> str:
    """The shell command that shows `engine`'s version on a node (`agent_command` runs llmgw-agent there)."""
    if engine == "sim":
        # The simulated engine ships inside the agent itself.
        return f"{agent_command} sim-engine --help"
    if engine not in _DEFAULTS:
        raise StepFailed(f"unknown engine {engine!r}; known: sim, {', '.join(sorted(_DEFAULTS))}")
    program, args = _DEFAULTS[engine]
    path = settings.path if settings is not None and settings.path else program
    return f"{shlex.quote(path)} {args}"


def _verdict(node: str, engine: str, command: str, code: int, output: str) -> EngineCheck:
    text = output.strip()
    if code == 127:
        program = shlex.split(command)[0]
        text = f"{program} not found on {node}; install it or set spec.engines.{engine}.path in the Cluster"
    elif code != 0 and not text:
        text = f"exit status {code}"
    return EngineCheck(node, engine, command, code == 0, text)


async def check_remote(
    target: SshTarget, engine: str, engines: Mapping[str, EngineSettings], layout: Layout
) -> EngineCheck:
    command = engine_command(engine, engines.get(engine), shlex.quote(layout.agent_bin))
    conn = await connect(target)
    try:
        code, output = await Remote(conn, target).status(command)
    finally:
        conn.close()
    return _verdict(target.node, engine, command, code, output)


async def check_local(
    node: str, engine: str, engines: Mapping[str, EngineSettings], limit_s: float = 60.0
) -> EngineCheck:
    """The same check on the machine the CLI runs on (a `local: true` node, whose agent is this Python's)."""
    agent = f"{shlex.quote(sys.executable)} -m llmgw_agent.main"
    command = engine_command(engine, engines.get(engine), agent)
    proc = await asyncio.create_subprocess_shell(
        command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(limit_s):  # not wait_for: on 3.11 it can swallow a cancel
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return EngineCheck(node, engine, command, False, f"no answer within {limit_s:g}s")
    return _verdict(node, engine, command, proc.returncode or 0, out.decode(errors="replace"))
