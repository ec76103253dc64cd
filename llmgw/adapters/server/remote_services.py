"""The controller and router of a machine `llmgw server add` reaches over SSH: started as `llmgw server init`
starts its own (the unit with systemd; without, the unit's command as the service account, its pid kept,
`services.process_start_script`), and awaited from here over TLS at the address others dial, verified against
the cluster CA: what answers is what the rest of the cluster will reach.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmgw.adapters.server import layout as L
from llmgw.adapters.server.services import HEALTH, START_S, fetch, process_start_script
from llmgw.adapters.server.steps import Outcome
from llmgw.adapters.ssh.remote import Remote, StepFailed

STOP_S = 60  # a router draining its requests takes a while


@dataclass
class RemoteServices:
    r: Remote
    lay: L.ServerLayout
    s: L.ServerSettings
    mode: Literal["systemd", "process"]
    address: str  # where the machine is dialed
    ca_file: Path  # the cluster CA's certificate, on this machine
    dry_run: bool
    health_timeout: float

    async def service(self, name: str, dirty: bool) -> Outcome:
        pid = await self.running(name)
        if pid is not None and not dirty:
            return "unchanged", f"running (pid {pid}){await self.healthy(name)}"
        verb = "restart" if pid is not None else "start"
        if self.dry_run:
            return "skipped", f"would {verb} the {name}"
        if pid is not None and self.mode == "process":
            await self.r.run(_stop_command(pid))
        if self.mode == "systemd":
            await self.r.run(f"systemctl enable llmgw-{name} && systemctl restart llmgw-{name}")
        else:
            await self.r.run(process_start_script(self.lay, self.s, name))
        deadline = time.monotonic() + START_S
        while (pid := await self.running(name)) is None:
            if time.monotonic() > deadline:
                raise StepFailed(f"the {name} did not start: {await self.log_tail(name)}")
            await asyncio.sleep(0.2)
        return "changed", f"{verb}ed (pid {pid}){await self.healthy(name)}"

    async def running(self, name: str) -> int | None:
        if self.mode == "systemd":
            _, active = await self.r.status(f"systemctl is-active llmgw-{name}")
            if active.strip() != "active":
                return None
            out = await self.r.run(f"systemctl show -p MainPID --value llmgw-{name}")
            return int(out.strip() or 0) or None
        pid_file = self.lay.pid_file(name)
        out = await self.r.run(
            f'pid=$(cat {pid_file} 2>/dev/null) && [ -r "/proc/$pid/cmdline" ] && echo "$pid" && '
            "tr '\\0' '\\n' < \"/proc/$pid/cmdline\"; true"
        )
        lines = out.splitlines()
        if not lines or not lines[0].isdigit():
            return None
        want = L.exec_argv(self.lay, self.s, name)
        cmdline = lines[1:]
        return int(lines[0]) if cmdline[-len(want) :] == want else None  # not its command yet, or recycled

    async def healthy(self, name: str) -> str:
        """Waits for the service's health over TLS at the address others dial; words for the step."""
        port = self.s.controller_port if name == "controller" else self.s.router_port
        url = f"https://{self.address}:{port}{HEALTH[name]}"
        start, last = time.monotonic(), ""
        while time.monotonic() - start < self.health_timeout:
            try:
                await asyncio.to_thread(fetch, url, self.ca_file)
                return f", {url} answered over TLS after {time.monotonic() - start:.1f}s"
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            if (gone := await self.gone(name)) is not None:
                last += f"; {gone}"
                break
            await asyncio.sleep(0.5)
        raise StepFailed(f"the {name}: {url} did not answer ({last}): {await self.log_tail(name)}")

    async def gone(self, name: str) -> str | None:
        """Why the service will not answer (its process ended), or None while it runs: as init waits
        (services.Services._gone), the pid's process counts while it exists."""
        if self.mode == "systemd":
            return None if await self.running(name) is not None else "its unit is not active"
        pid_file = self.lay.pid_file(name)
        out = await self.r.run(
            f'pid=$(cat {pid_file} 2>/dev/null); if [ -n "$pid" ] && [ -d "/proc/$pid" ]; then echo alive; '
            'else echo "${pid:-(no pid file)}"; fi'
        )
        return None if out.strip() == "alive" else f"its process {out.strip()} ended"

    async def log_tail(self, name: str) -> str:
        if self.mode == "systemd":
            _, out = await self.r.status(f"journalctl -u llmgw-{name} -n 10 --no-pager")
        else:
            _, out = await self.r.status(f"tail -n 10 {self.lay.log_file(name)}")
        return out.strip()[-1500:] or "(its log is empty)"


def _stop_command(pid: int) -> str:
    return (
        f"kill {pid} 2>/dev/null; i=0; while [ -d /proc/{pid} ] && [ $i -lt {STOP_S * 5} ]; do "
        f"sleep 0.2; i=$((i+1)); done; [ -d /proc/{pid} ] && kill -9 {pid}; true"
    )
