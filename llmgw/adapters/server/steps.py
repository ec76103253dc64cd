"""Steps `llmgw server init` takes on its own machine and `llmgw server add` on another over SSH: the service
account, its directories and what it owns. They only run commands, so they act the same on a `Machine` (this
one, maybe under a root) and on a `Remote` (llmgw.adapters.ssh.remote).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from llmgw.adapters.server import layout as L
from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.bootstrap import NodeResult, Status, Step
from llmgw.adapters.ssh.ca import IssuedCert
from llmgw.adapters.ssh.remote import RemoteFile, StepFailed

Outcome = tuple[Status, str]
Act = Callable[[str, Callable[[], Awaitable[object]]], Awaitable[Outcome]]
Dir = tuple[str, str, str, str]  # path, owner, group, mode


class Walk:
    """One run of steps on one machine (init's, add's): each recorded as it ends, shown as it is recorded."""

    def __init__(self, who: str, dry_run: bool, on_step: Callable[[Step], None] | None) -> None:
        self.result = NodeResult(who)
        self.dry_run = dry_run
        self.on_step = on_step

    def record(self, name: str, status: Status, detail: str = "") -> None:
        step = Step(name, status, detail)
        self.result.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)

    async def act(self, words: str, do: Callable[[], Awaitable[object]]) -> Outcome:
        """The thin act after a step's look decided: done (changed), or only said under dry_run (skipped)."""
        if self.dry_run:
            return "skipped", "would " + words
        await do()
        return "changed", words


class Shell(Protocol):
    """What the shared steps need of the machine they act on."""

    async def run(self, command: str, *, check: bool = True, input: str | None = None) -> str: ...

    async def status(self, command: str) -> tuple[int, str]: ...


def debian_or_ubuntu(os_release: str | None, command: str, where: str) -> str:
    """The system's name from its /etc/os-release; StepFailed unless it is Debian, Ubuntu or one of theirs."""
    fields = dict(ln.split("=", 1) for ln in (os_release or "").splitlines() if "=" in ln)
    ids = {fields.get("ID", "").strip('"'), *fields.get("ID_LIKE", "").strip('"').split()}
    name = fields.get("PRETTY_NAME", "an unknown system").strip('"')
    if not ids & {"debian", "ubuntu"}:
        raise StepFailed(f"{command} installs on Debian or Ubuntu; {where} runs {name}")
    return name


async def packages(m: Shell, wanted: list[str], act: Act) -> Outcome:
    """The Debian packages in `wanted` installed with apt-get when missing (its lists fetched when absent)."""
    _, out = await m.status("dpkg-query -W -f='${Package} ${Status}\\n' " + " ".join(wanted))
    installed = {ln.split()[0] for ln in out.splitlines() if ln.endswith("install ok installed")}
    missing = [p for p in wanted if p not in installed]
    if not missing:
        return "unchanged", " and ".join(wanted) + " installed"
    lists = "ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || apt-get update -q"
    command = f"{{ {lists}; }} && apt-get install -y -q --no-install-recommends " + " ".join(missing)
    return await act(f"install {' '.join(missing)} with apt-get", lambda: m.run(command))


async def account(m: Shell, lay: L.ServerLayout, act: Act) -> Outcome:
    code, _ = await m.status(f"id -u {L.USER}")
    if code == 0:
        return "unchanged", f"the {L.USER} account exists"
    command = (
        "shell=$(command -v nologin || echo /bin/false); useradd --system --user-group --home-dir "
        f'{lay.state} --no-create-home --shell "$shell" {L.USER}'
    )
    return await act(f"add the system account {L.USER}", lambda: m.run(command))


def control_plane_tls(
    lay: L.ServerLayout, ca_pem: bytes, server: IssuedCert, client: IssuedCert
) -> list[RemoteFile]:
    """The cluster CA, the control plane's server certificate and its router's client certificate, with their
    modes (keys readable by the service's group only): what init writes on its machine and add on another."""
    return [
        RemoteFile(lay.ca_cert, ca_pem, 0o644),
        RemoteFile(lay.server_cert, server.cert_pem, 0o644),
        RemoteFile(lay.server_key, server.key_pem, 0o640),
        RemoteFile(lay.router_client_cert, client.cert_pem, 0o644),
        RemoteFile(lay.router_client_key, client.key_pem, 0o640),
    ]


def wanted_dirs(lay: L.ServerLayout, *, node: bool, process_mode: bool) -> list[Dir]:
    """(path, owner, group, mode) of every directory the control plane needs."""
    u = L.USER
    dirs = [
        (lay.etc, "root", u, "750"),
        (lay.tls, "root", u, "750"),
        (lay.secrets, u, u, "700"),
        (lay.state, u, u, "750"),
        (lay.controller_state, u, u, "700"),
        (lay.router_state, u, u, "700"),
        (lay.log, u, u, "750"),
    ]
    if process_mode:  # pid files of the services started without systemd
        dirs.append((lay.run, "root", "root", "755"))
    if node:
        nl = render.Layout()
        dirs += [(nl.prefix, "root", u, "750"), (nl.etc, u, u, "700")]
        dirs += [(p, u, u, "750") for p in (nl.state, nl.weights, nl.models)]
    return dirs


async def directories(m: Shell, wanted: list[Dir], act: Act) -> Outcome:
    paths = " ".join(p for p, *_ in wanted)
    _, out = await m.status(f"for d in {paths}; do stat -c '%n %U %G %a' \"$d\" 2>/dev/null; done")
    found = {line.split()[0]: tuple(line.split()[1:]) for line in out.splitlines() if line.strip()}
    fix = [(p, o, g, mode) for p, o, g, mode in wanted if found.get(p) != (o, g, mode)]
    if not fix:
        return "unchanged", f"{len(wanted)} directories in place"
    command = "\n".join(
        f"mkdir -p {p} && chown {o}:{g} {p} && chmod {mode} {p} || exit 1" for p, o, g, mode in fix
    )
    return await act("make or fix " + ", ".join(p for p, *_ in fix), lambda: m.run(command))


async def ownership(m: Shell, lay: L.ServerLayout, act: Act, *, node: bool) -> Outcome:
    """What was written as root is the account's where the account writes, readable by it where it reads."""
    nl = render.Layout()
    extra = [nl.etc, nl.state, nl.weights, nl.models] if node else []
    owned = " ".join([*lay.owned(), *extra])
    u = L.USER
    look = (
        f"a=$(find {owned} \\( ! -user {u} -o ! -group {u} \\) -print -quit 2>/dev/null); "
        f"b=$(find {lay.etc} -path {lay.secrets} -prune -o ! -group {u} -print -quit 2>/dev/null); "
        'printf "%s\\n%s\\n" "$a" "$b"'
    )
    stray = [line for line in (await m.run(look)).splitlines() if line.strip()]
    if not stray:
        return "unchanged", f"{u} owns {owned}"
    fix = f"chown -R {u}:{u} {owned} && find {lay.etc} -path {lay.secrets} -prune -o -exec chgrp {u} {{}} +"
    return await act(f"give {u} what it owns (found {stray[0]})", lambda: m.run(fix))
