"""Upgrade the agent of a node bootstrapped over SSH: a new venv beside the old, switch, restart the agent only.

The steps, each recorded as bootstrap's are (`Step`, `NodeResult`):

- connect, check, wheels: bootstrap's own (the machine probe, the wheels copied by sha256 over SFTP);
- verify: every wheel on the node hashed again and compared with the wheelhouse manifest, before anything is
  installed from them (a copy that went wrong is never installed);
- install: a fresh venv at `venvs/<digest>` with the new agent, beside the one running (never pip into a venv
  a live agent imports from);
- switch: `venv` becomes a link to the new venv in one rename (the first upgrade moves bootstrap's venv
  directory into `venvs/` to keep it for a rollback);
- restart: only the agent — systemd's `KillMode=process` and the supervisor's restart loop leave its engines
  running, and the new agent re-adopts them;
- back: waits until the caller's `came_back(node, since, version)` says the agent registered again, Ready, on
  the new version with its engines adopted.

A failure after the switch switches back and restarts the old agent (`rollback`), so a node is left on the
version it ran. A node whose venv already holds this wheelhouse is left alone (every step `unchanged`).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.bootstrap import (
    BootstrapOptions,
    NodeResult,
    OnStep,
    Status,
    Step,
    StepFn,
    _Run,
    pip_install_command,
    run_on_node,
    run_steps,
)
from llmgw.adapters.ssh.remote import Remote, RemoteFile, SshTarget, StepFailed
from llmgw.adapters.ssh.wheels import Wheelhouse

# (node, the controller's monotonic time the agent was restarted, the agent version wanted or None for any):
# None once the agent is back as wanted, else what is still missing (said when the wait runs out).
CameBack = Callable[[str, float, str | None], Awaitable[str | None]]
POLL_S = 0.25


@dataclass(frozen=True)
class UpgradeOptions:
    wheelhouse: Wheelhouse
    came_back: CameBack
    old_version: str | None = None  # what the agent ran before: a rollback waits for it
    layout: render.Layout = field(default_factory=render.Layout)
    service: Literal["auto", "systemd", "process"] = "auto"
    timeout: float = 120.0
    # The old agent is known to work: giving up on it early leaves the node with no agent at all, so a
    # rollback may wait longer than the new agent was given. None: the same as `timeout`.
    rollback_timeout: float | None = None
    on_step: OnStep | None = None


def switch_command(layout: render.Layout, to: str, keep_as: str) -> str:
    """Point `venv` at `to` in one rename; a real directory there (bootstrap's) is first moved to `keep_as`.

    Prints `was PATH`: the venv in use before, for a rollback."""
    q = shlex.quote
    v, tmp = q(layout.venv), q(layout.venv + ".next")
    return (
        "set -e\n"
        f"if [ -L {v} ]; then echo was $(readlink -f {v})\n"
        f"elif [ -d {v} ]; then rm -rf {q(keep_as)}; mv -T {v} {q(keep_as)}; echo was {q(keep_as)}\n"
        "else echo was; fi\n"
        f"rm -f {tmp}; ln -s {q(to)} {tmp}; mv -T {tmp} {v}\n"
    )


def restart_agent_command(layout: render.Layout) -> str:
    """Stop the agent under its supervisor (which starts it again, from whatever `venv` points at now).

    Only the supervisor's direct children are signalled: the agent, or the sleep between restarts. Engines are
    the agent's children in process groups of their own, and outlive it by design."""
    return (
        f'pid=$(cat {shlex.quote(layout.supervisor_pid)} 2>/dev/null) && [ -n "$pid" ] && '
        f"{render._is_supervisor(layout)} || {{ echo none; exit 0; }}\n"
        'kids=$(pgrep -P "$pid" || true)\n'
        'if [ -n "$kids" ]; then kill -TERM $kids; fi\n'
        "echo restarted $kids\n"
    )


class _Upgrade:
    def __init__(self, target: SshTarget, opts: UpgradeOptions) -> None:
        self.target = target
        self.opts = opts
        self.layout = opts.layout
        self.result = NodeResult(target.node)
        boot = BootstrapOptions(
            controllers=(),
            wheelhouse=opts.wheelhouse,
            registered=None,
            layout=opts.layout,
            service=opts.service,
        )
        self.boot = _Run(target, boot)  # bootstrap's probe and wheel copy, not a second installer
        self.current = False  # the node already runs this wheelhouse
        self.previous: str | None = None  # the venv the switch replaced
        self.since = float("-inf")  # when the agent was restarted (the controller's monotonic clock)

    def record(self, name: str, status: Status, detail: str = "") -> None:
        step = Step(name, status, detail)
        self.result.steps.append(step)
        if self.opts.on_step is not None:
            self.opts.on_step(self.target.node, step)

    def steps(self) -> list[tuple[str, StepFn]]:
        return [
            ("check", self.check),
            ("wheels", self.boot.wheels),
            ("verify", self.verify),
            ("install", self.install),
            ("switch", self.switch),
            ("restart", self.restart),
            ("back", self.back),
        ]

    async def run(self) -> NodeResult:
        return await run_on_node(self.target, self.result, self.record, self.steps, self._steps)

    async def _steps(self, remote: Remote) -> None:
        if not await run_steps(remote, self.steps(), self.record, self._skip) and self.previous is not None:
            await self._rollback(remote)

    def _skip(self, name: str) -> str | None:
        return "already runs this wheelhouse" if self.current and name != "check" else None

    async def check(self, remote: Remote) -> tuple[Status, str]:
        status, detail = await self.boot.check(remote)
        code, out = await remote.status(f"cat {shlex.quote(self.layout.installed_marker)}")
        if code == 0 and out.strip() == self.opts.wheelhouse.digest:
            self.current = True
        return status, detail

    async def verify(self, remote: Remote) -> tuple[Status, str]:
        house, d = self.opts.wheelhouse, self.layout.wheels
        states = await remote.file_states([f"{d}/{n}" for n in sorted(house.wheels)])
        wrong = [n for n, sha in sorted(house.wheels.items()) if states.get(f"{d}/{n}", ("", 0))[0] != sha]
        if wrong:
            raise StepFailed(
                f"{', '.join(wrong)} on {self.target.node} do(es) not match the sha256 in the wheelhouse "
                "manifest after the copy; nothing was installed"
            )
        return "unchanged", f"{len(house.wheels)} wheels match the manifest's sha256"

    async def install(self, remote: Remote) -> tuple[Status, str]:
        house, lay = self.opts.wheelhouse, self.layout
        new = lay.venv_for(house.digest)
        q = shlex.quote(new)
        python = shlex.quote(self.boot.machine.python)
        code, out = await remote.status(
            f"mkdir -p {shlex.quote(lay.venvs)} && chmod 755 {shlex.quote(lay.venvs)} && "
            f"rm -rf {q} && {python} -m venv {q}"
        )
        if code != 0:
            raise StepFailed(f"`python3 -m venv {new}` failed on {self.target.node}: {out.strip()[-300:]}")
        code, out = await remote.status(pip_install_command(new, lay, house))
        if code != 0:
            await remote.status(f"rm -rf {q}")
            raise StepFailed(
                f"installing llmgw-agent {house.agent_version} on {self.target.node} failed "
                f"(the running agent is untouched): {out.strip()[-500:]}"
            )
        await remote.put(RemoteFile(f"{new}/.llmgw-wheelhouse", house.digest.encode() + b"\n", 0o644))
        return "changed", f"llmgw-agent {house.agent_version} in {new}"

    async def switch(self, remote: Remote) -> tuple[Status, str]:
        lay = self.layout
        code, marker = await remote.status(f"cat {shlex.quote(lay.installed_marker)}")
        keep_as = lay.venv_for(marker.strip() if code == 0 and marker.strip() else "bootstrap")
        out = await remote.run(switch_command(lay, lay.venv_for(self.opts.wheelhouse.digest), keep_as))
        was = out.strip().removeprefix("was").strip()
        self.previous = was or None
        return "changed", f"{lay.venv} -> {lay.venv_for(self.opts.wheelhouse.digest)} (was {was or 'none'})"

    async def _restart(self, remote: Remote) -> float:
        since = time.monotonic()
        if self.boot.service_mode() == "systemd":
            await remote.run(f"systemctl restart {shlex.quote(self.layout.unit_name)}")
            return since
        out = await remote.run(restart_agent_command(self.layout))
        if out.split()[:1] != ["restarted"]:
            raise StepFailed(
                f"no agent supervisor runs on {self.target.node} ({self.layout.supervisor_pid}); "
                "bootstrap the node first"
            )
        return since

    async def restart(self, remote: Remote) -> tuple[Status, str]:
        self.since = await self._restart(remote)
        return "changed", "restarted the agent; its engines keep running"

    async def _wait(self, since: float, version: str | None, wait_s: float) -> str | None:
        deadline = time.monotonic() + wait_s
        missing = await self.opts.came_back(self.target.node, since, version)
        while missing is not None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            missing = await self.opts.came_back(self.target.node, since, version)
        return missing

    async def back(self, remote: Remote) -> tuple[Status, str]:
        version = self.opts.wheelhouse.agent_version
        missing = await self._wait(self.since, version, self.opts.timeout)
        if missing is not None:
            raise StepFailed(
                f"the agent on {self.target.node} did not come back within {self.opts.timeout:g}s: {missing}"
            )
        return "changed", f"back on llmgw-agent {version}, engines adopted"

    async def _rollback(self, remote: Remote) -> None:
        """Point `venv` back at the venv it replaced and restart the agent that ran before."""
        previous = self.previous
        assert previous is not None
        try:
            await remote.run(switch_command(self.layout, previous, previous))
            since = await self._restart(remote)
            wait_s = self.opts.rollback_timeout or self.opts.timeout
            missing = await self._wait(since, self.opts.old_version, wait_s)
        except Exception as exc:
            self.record("rollback", "failed", f"{type(exc).__name__}: {exc}; the node needs a hand")
            return
        if missing is not None:
            self.record(
                "rollback", "failed", f"switched back to {previous}, but the agent is not back: {missing}"
            )
        else:
            self.record("rollback", "changed", f"back on {previous}, its engines adopted")


async def upgrade_node(target: SshTarget, opts: UpgradeOptions) -> NodeResult:
    return await _Upgrade(target, opts).run()
