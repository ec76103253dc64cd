"""The steps of `llmgw server init` that install, provision and start: packages, the store, the services.

Where systemd runs, a service is its unit (`systemctl enable`, `restart`); where it does not (a container, a
test's Debian tree), init starts the unit's own command as the service account in a session of its own, and
keeps its pid in /run/llmgw. Either way the step waits for the service's /health over TLS, verified against the
cluster CA.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from llmgw.adapters.server import layout as L, steps
from llmgw.adapters.server.machine import Machine
from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.bootstrap import Status
from llmgw.adapters.ssh.remote import RemoteFile, StepFailed

if TYPE_CHECKING:
    from llmgw.adapters.server.options import InitOptions

Outcome = tuple[Status, str]
Act = Callable[[str, Callable[[], Awaitable[object]]], Awaitable[Outcome]]
HEALTH = {"controller": "/healthz", "router": "/health"}


class Services:
    def __init__(
        self,
        m: Machine,
        lay: L.ServerLayout,
        s: L.ServerSettings,
        opts: InitOptions,
        act: Act,
        dirty: set[str],
    ) -> None:
        self.m, self.lay, self.s, self.opts, self.act = m, lay, s, opts, act
        self.dirty = dirty  # services whose inputs this run changed (restarted), shared with the Init

    def mode(self) -> Literal["systemd", "process"]:
        if self.opts.service != "auto":
            return self.opts.service
        return "systemd" if self.m.systemd else "process"

    # ------------------------------------------------------------------------------------ packages, store

    async def packages(self, m: Machine) -> Outcome:
        return await steps.packages(m, ["git"] + ([] if self.opts.store else ["postgresql"]), self.act)

    async def store(self, m: Machine) -> Outcome:
        if self.opts.store is not None:
            file = RemoteFile(self.lay.store_dsn, self.opts.store.encode() + b"\n", 0o600)
            if (await m.file_states([file.path])).get(file.path, ("", 0))[0] == file.state[0]:
                return "unchanged", f"the store given, its DSN in {self.lay.store_dsn}"
            return await self.act(f"keep the store's DSN in {self.lay.store_dsn}", lambda: m.put(file))
        code, out = await m.status("pg_lsclusters -h")
        if code != 0:
            if self.opts.dry_run:
                return "skipped", "would provision PostgreSQL once installed"
            raise StepFailed(f"pg_lsclusters failed (is postgresql installed?): {out.strip()[-300:]}")
        clusters = [line.split() for line in out.splitlines() if line.strip()]
        if not clusters:
            raise StepFailed("PostgreSQL has no cluster: make one (pg_createcluster 15 main --start)")
        version, name, port, state = clusters[0][:4]
        where = f"PostgreSQL {version}/{name} on port {port}"
        started: list[str] = []
        if state != "online":
            if self.opts.dry_run:
                return "skipped", f"would start {where}, then make the {L.USER} role and database"
            await m.run(self._pg_start(version, name))
            started.append(f"started {where}")
        kept = _password(m.read_text(self.lay.store_dsn))
        dsn = f"postgresql://{L.USER}:{kept}@127.0.0.1:{port}/{L.USER}" if kept else ""
        if dsn and await _connects(dsn):
            return ("changed" if started else "unchanged"), ", ".join(
                [*started, f"{where}: {L.USER} logs in"]
            )
        password = kept or secrets.token_urlsafe(24)  # URL- and SQL-safe characters only
        dsn = f"postgresql://{L.USER}:{password}@127.0.0.1:{port}/{L.USER}"

        async def provision() -> None:
            await m.run(
                f"runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p {port}", input=_role_sql(password)
            )
            await m.put(RemoteFile(self.lay.store_dsn, dsn.encode() + b"\n", 0o600))
            if not await _connects(dsn):
                raise StepFailed(f"{L.USER} cannot log in to {where} with the password just set")

        words = f"make the {L.USER} role and database on {where}, password kept in {self.lay.store_dsn}"
        return await self.act(", ".join([*started, words]), provision)

    def _pg_start(self, version: str, name: str) -> str:
        if self.mode() == "systemd":
            return f"systemctl enable --now postgresql@{version}-{name}"
        return f"pg_ctlcluster {version} {name} start"

    async def migrations(self, m: Machine) -> Outcome:
        from llmgw.store import Store

        dsn = (m.read_text(self.lay.store_dsn) or "").strip()
        if not dsn:
            return "skipped", "would bring the store's schema up to date"
        store = await Store.open(dsn, migrate_schema=False)
        try:
            before = await store.schema_version()
            if self.opts.dry_run:
                return "skipped", f"would bring the schema up to date (now version {before})"
            applied = await store.migrate()
            after = await store.schema_version()
        finally:
            await store.close()
        if applied:
            return "changed", f"schema version {before} -> {after}"
        return "unchanged", f"schema version {after}"

    # ------------------------------------------------------------------------------------ credentials

    async def router_token(self, m: Machine) -> Outcome:
        return await self._credential(m, "/api/v1/credentials/router", self.lay.router_token)

    async def node_token(self, m: Machine) -> Outcome:
        """With --node: the agent's hub asks for the node's token beside its certificate."""
        return await self._credential(m, f"/api/v1/credentials/node/{self.opts.name}", render.Layout().token)

    async def _credential(self, m: Machine, path: str, file_path: str) -> Outcome:
        """A token the controller derives (from the cluster secret) fetched into `file_path`, the account's."""
        if self.opts.dry_run:
            return "skipped", f"would fetch {path} from the controller into {file_path}"
        admin = (m.read_text(self.lay.admin_token) or "").strip()
        url = f"https://127.0.0.1:{self.s.controller_port}{path}"
        token = await fetch_token(url, m.path(self.lay.ca_cert), admin, self.opts.health_timeout)
        file = RemoteFile(file_path, token.encode() + b"\n", 0o600)
        if not await m.sync_files([file]):
            return "unchanged", file_path
        await m.run(f"chown {L.USER}:{L.USER} {file_path}")
        self.dirty.add("router" if file_path == self.lay.router_token else "agent")
        return "changed", f"wrote {file_path}"

    def _get(self, url: str, token: str | None = None) -> bytes:
        return fetch(url, self.m.path(self.lay.ca_cert), token)

    def agent_files(self) -> list[RemoteFile]:
        nl = render.Layout()
        settings = render.AgentSettings(
            node=self.opts.name,
            controllers=(self.s.controller_address,),
            tls=True,
            token=True,  # the hub asks for the node's token beside its certificate (node_token step)
            advertise_host=self.s.advertise,
        )
        return [
            RemoteFile(nl.config, render.agent_config(nl, settings), 0o600),
            RemoteFile(self.lay.unit_path("agent"), L.unit(self.lay, self.s, "agent"), 0o644),
        ]

    # ------------------------------------------------------------------------------------ services

    async def service(self, name: str) -> Outcome:
        pid = await self._running(name)
        if pid is not None and name not in self.dirty:
            waited = await self._healthy(name)
            return "unchanged", f"running (pid {pid}){waited}"
        verb = "restart" if pid is not None else "start"
        if self.opts.dry_run:
            return "skipped", f"would {verb} the {name}"
        if pid is not None:
            await self._stop(name, pid)
        await self._start(name)
        pid = await self._started(name)
        if pid is None:
            raise StepFailed(f"the {name} did not start: {await self._log_tail(name)}")
        waited = await self._healthy(name)
        return "changed", f"{verb}ed (pid {pid}){waited}"

    async def _running(self, name: str) -> int | None:
        if self.mode() == "systemd":
            _, active = await self.m.status(f"systemctl is-active llmgw-{name}")
            if active.strip() != "active":
                return None
            return (
                int((await self.m.run(f"systemctl show -p MainPID --value llmgw-{name}")).strip() or 0)
                or None
            )
        text = self.m.read_text(self.lay.pid_file(name))
        pid = int(text) if text and text.strip().isdigit() else None
        return pid if pid is not None and _runs(pid, L.exec_argv(self.lay, self.s, name)) else None

    async def _started(self, name: str) -> int | None:
        """The started service's pid once the process is its command: just after the spawn it is still
        `setsid`, `setpriv` or `env` on its way there (a check at once failed a start that went fine). None when
        the process ended first, or is not its command within START_S."""
        deadline = time.monotonic() + START_S
        while True:
            pid = await self._running(name)
            if pid is not None or time.monotonic() > deadline:
                return pid
            if self.mode() != "systemd" and not _alive(self.m.read_text(self.lay.pid_file(name))):
                return None
            await asyncio.sleep(0.1)

    async def _start(self, name: str) -> None:
        if self.mode() == "systemd":
            await self.m.run(f"systemctl enable llmgw-{name} && systemctl restart llmgw-{name}")
            return
        await self.m.run(process_start_script(self.lay, self.s, name))

    async def _stop(self, name: str, pid: int) -> None:
        if self.mode() == "systemd":
            return  # `systemctl restart` stops it
        os.kill(pid, signal.SIGTERM)
        if not await asyncio.to_thread(_wait_gone, pid, 60.0):
            os.kill(pid, signal.SIGKILL)

    async def _healthy(self, name: str) -> str:
        """Waits for the service's /health over TLS; words for the step. StepFailed with its log's end."""
        port = self.s.controller_port if name == "controller" else self.s.router_port
        url = f"https://127.0.0.1:{port}{HEALTH.get(name, '')}"
        start = time.monotonic()
        last = ""
        while time.monotonic() - start < self.opts.health_timeout:
            try:
                if name != "agent":
                    await asyncio.to_thread(self._get, url)
                    return f", {HEALTH[name]} answered over TLS after {time.monotonic() - start:.1f}s"
                last = await self._node_state()
                if last == "Ready":
                    return f", node {self.opts.name} Ready after {time.monotonic() - start:.1f}s"
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            if (gone := await self._gone(name)) is not None:
                last += f"; {gone}"
                break
            await asyncio.sleep(0.5)
        what = f"node {self.opts.name} did not become Ready" if name == "agent" else f"{url} did not answer"
        raise StepFailed(f"the {name}: {what} ({last}): {await self._log_tail(name)}")

    async def _gone(self, name: str) -> str | None:
        """Why the service will not answer (its process ended), or None while it runs. Without systemd the pid's
        process counts while it exists: a command line read as it changes (or not at all) is no end."""
        if self.mode() == "systemd":
            return None if await self._running(name) is not None else "its unit is not active"
        text = (self.m.read_text(self.lay.pid_file(name)) or "").strip()
        return None if _alive(text) else f"its process {text or '(no pid file)'} ended"

    async def _node_state(self) -> str:
        """This machine's node as the controller sees it (the agent's health is its registration)."""
        admin = (self.m.read_text(self.lay.admin_token) or "").strip()
        url = f"https://127.0.0.1:{self.s.controller_port}/api/v1/nodes"
        nodes = json.loads(await asyncio.to_thread(self._get, url, admin))["nodes"]
        return next((str(n["state"]) for n in nodes if n["name"] == self.opts.name), "not registered")

    async def _log_tail(self, name: str) -> str:
        if self.mode() == "systemd":
            _, out = await self.m.status(f"journalctl -u llmgw-{name} -n 10 --no-pager")
        else:
            out = "\n".join((self.m.read_text(self.lay.log_file(name)) or "").splitlines()[-10:])
        return out.strip()[-1500:] or "(its log is empty)"


def fetch(url: str, ca_file: Path, token: str | None = None) -> bytes:
    """GET over TLS verified against the cluster CA's certificate, with the bearer token when given."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5, context=ctx) as r:
        return bytes(r.read())


async def fetch_token(url: str, ca_file: Path, admin: str, limit_s: float) -> str:
    """The token a credentials endpoint answers. A controller just started answers 503 until it has read the
    repo's Cluster (whose secret tokens derive from, with a lease): asked again for `limit_s`."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            return str(json.loads(await asyncio.to_thread(fetch, url, ca_file, admin))["token"])
        except urllib.error.HTTPError as exc:
            said = exc.read().decode(errors="replace")[-300:]
            if exc.code != 503 or time.monotonic() > deadline:
                raise StepFailed(f"{url} answered {exc.code}: {said}") from None
        await asyncio.sleep(0.5)


def process_start_script(lay: L.ServerLayout, s: L.ServerSettings, name: str) -> str:
    """Where systemd does not run: the unit's command, as its user, in a session of its own, its pid kept.
    Separate statements so the shell's output is not held open by a backgrounded list
    (render.start_supervisor_command says why)."""
    home = {"controller": lay.controller_state, "router": lay.router_state}.get(name, render.Layout().state)
    env = [f"HOME={home}", *(f"{k}={v}" for k, v in sorted(s.environment.items()))]
    drop = f"setpriv --reuid={L.USER} --regid={L.USER} --init-groups --reset-env --"
    argv = shlex.join(["env", *env, *L.exec_argv(lay, s, name)])
    log = lay.log_file(name)
    return (
        f"mkdir -p {lay.run} {lay.log} || exit 1\numask 077\n"
        f"touch {log} && chown {L.USER}:{L.USER} {log} || exit 1\n"
        f"setsid nohup {drop} {argv} >> {log} 2>&1 < /dev/null &\n"
        f"echo $! > {lay.pid_file(name)}\n"
    )


START_S = 30.0  # from the spawn until the process is the service's command (a loaded machine: seconds)


def _alive(pid_text: str | None) -> bool:
    """Whether the process a pid file names still exists (whatever it runs by now)."""
    return bool(pid_text and pid_text.strip().isdigit() and Path(f"/proc/{pid_text.strip()}").exists())


def _runs(pid: int, argv: list[str]) -> bool:
    """Whether `pid` runs `argv` (a script's interpreter may come first), not a recycled pid."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return False
    want = [a.encode() for a in argv]
    return len(cmdline) >= len(want) and cmdline[-len(want) :] == want


def _wait_gone(pid: int, limit_s: float) -> bool:
    """Whether `pid` ended within `limit_s` (a service draining its requests takes a while)."""
    deadline = time.monotonic() + limit_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _password(dsn_text: str | None) -> str | None:
    """The password a kept DSN holds (so a second init keeps it), or None."""
    if not dsn_text or "://" not in dsn_text:
        return None
    userinfo = dsn_text.strip().split("://", 1)[1].split("@", 1)
    if len(userinfo) != 2 or ":" not in userinfo[0]:
        return None
    return userinfo[0].split(":", 1)[1] or None


def _role_sql(password: str) -> str:
    u = L.USER
    return (
        f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{u}') THEN CREATE ROLE {u} LOGIN; "
        "END IF; END$$;\n"
        f"ALTER ROLE {u} WITH LOGIN PASSWORD '{password}';\n"
        f"SELECT 'CREATE DATABASE {u} OWNER {u}' WHERE NOT EXISTS "
        f"(SELECT FROM pg_database WHERE datname = '{u}')\\gexec\n"
    )


async def _connects(dsn: str) -> bool:
    import psycopg

    try:
        conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=5)
    except psycopg.Error:
        return False
    await conn.close()
    return True
