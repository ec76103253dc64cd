"""`llmgw server init`: the control plane installed on the machine init runs on, step by step.

Every step looks (what exists), decides, and only then acts, thinly; each records what it found and what it did,
through the step runner node bootstrap uses (llmgw.adapters.ssh.bootstrap.run_steps). A second run finds
everything in place and records every step `unchanged`. With `dry_run` a step that would act records `skipped`
with the words "would ...", and nothing is written or started.

The steps: check the machine, install the packages it lacks (git; PostgreSQL when the store is local), the
service account and its directories, the cluster CA (made, or an existing one taken), the control plane's
certificate for every address of the machine, the admin token, the store (role, database, generated password,
migrations), the cluster repo (a URL to follow, or a starter made from the example), the settings files and
units, ownership, then each service started and its /health awaited over TLS.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Awaitable, Callable

from llmgw.adapters.server import layout as L, starter, steps
from llmgw.adapters.server.machine import Machine, first_routable_ipv4, machine_addresses
from llmgw.adapters.server.options import InitOptions
from llmgw.adapters.server.services import Services
from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.bootstrap import NodeResult, Status, run_steps
from llmgw.adapters.ssh.ca import CAError, ClusterCA
from llmgw.adapters.ssh.remote import RemoteFile, StepFailed

Outcome = tuple[Status, str]


class Init(steps.Walk):
    """One run of init on one machine: the steps in order, each recorded as it ends."""

    def __init__(self, machine: Machine, opts: InitOptions, lay: L.ServerLayout | None = None) -> None:
        super().__init__("this machine", opts.dry_run, opts.on_step)
        self.m = machine
        self.opts = opts
        self.lay = lay or L.ServerLayout()
        self.addresses = sorted({*machine_addresses(), *opts.addresses, opts.listen_host})
        advertise = opts.advertise or first_routable_ipv4(self.addresses)
        self.settings = L.ServerSettings(
            repo=opts.repo or self.lay.repo,
            bin_dir=opts.bin_dir,
            router_name=opts.name,
            listen_host=opts.listen_host,
            advertise=advertise,
            environment=dict(opts.environment),
            ha=opts.store is None or opts.store.startswith(("postgres://", "postgresql://")),
        )
        self.dirty: set[str] = set()  # services whose inputs this run changed: restarted
        self.services = Services(machine, self.lay, self.settings, opts, self.act, self.dirty)

    def steps(self) -> list[tuple[str, Callable[[Machine], Awaitable[Outcome]]]]:
        s = self.services
        chosen: list[tuple[str, Callable[[Machine], Awaitable[Outcome]]]] = [
            ("check", self.check),
            ("packages", s.packages),
            ("account", self.account),
            ("directories", self.directories),
            ("ca", self.ca),
            ("certificates", self.certificates),
            ("admin-token", self.admin_token),
            ("cluster-secret", self.cluster_secret),
            ("store", s.store),
            ("migrations", s.migrations),
            ("repo", self.repo),
            ("config", self.config),
            ("ownership", self.ownership),
            ("controller", lambda m: s.service("controller")),
            ("router-token", s.router_token),
            ("router", lambda m: s.service("router")),
        ]
        if self.opts.node:
            chosen += [("node-token", s.node_token), ("agent", lambda m: s.service("agent"))]
        return chosen

    async def run(self) -> NodeResult:
        await run_steps(self.m, self.steps(), self.record)
        done = {s.name for s in self.result.steps}
        for name, _ in self.steps():
            if name not in done:
                self.record(name, "skipped", "an earlier step failed")
        return self.result

    # ------------------------------------------------------------------------------------------ steps

    async def check(self, m: Machine) -> Outcome:
        name = steps.debian_or_ubuntu(m.read_text("/etc/os-release"), "llmgw server init", "this machine")
        if os.geteuid() != 0 and not self.opts.dry_run:
            raise StepFailed("llmgw server init acts as root (it adds an account, units, packages): use sudo")
        missing = [b for b in ("llmgw", "llmgw-router") if not m.path(f"{self.opts.bin_dir}/{b}").exists()]
        if missing:
            raise StepFailed(
                f"{', '.join(missing)} not found in {self.opts.bin_dir}: give --bin-dir, the directory "
                "holding the installed llmgw executables"
            )
        mode = self.services.mode()
        how = "systemd units" if mode == "systemd" else "no systemd running: services run as processes"
        return "unchanged", f"{name}, {how}, llmgw in {self.opts.bin_dir}"

    async def account(self, m: Machine) -> Outcome:
        return await steps.account(m, self.lay, self.act)

    async def directories(self, m: Machine) -> Outcome:
        process = self.services.mode() == "process"
        wanted = steps.wanted_dirs(self.lay, node=self.opts.node, process_mode=process)
        return await steps.directories(m, wanted, self.act)

    async def ca(self, m: Machine) -> Outcome:
        here = m.path(self.lay.ca_dir)
        present = (here / "ca.key").exists() and (here / "ca.crt").exists()
        given = self.opts.ca_from
        if given is not None:
            theirs = (given / "ca.crt").read_bytes() if (given / "ca.crt").exists() else None
            if theirs is None or not (given / "ca.key").exists():
                raise StepFailed(f"--ca-dir {given}: expected ca.key and ca.crt there")
            if present and (here / "ca.crt").read_bytes() != theirs:
                raise StepFailed(
                    f"a different cluster CA is already in {self.lay.ca_dir}: move it away to take {given}"
                )
            if present:
                return "unchanged", f"the CA from {given} in {self.lay.ca_dir}"

            async def take() -> None:
                here.mkdir(parents=True, exist_ok=True, mode=0o700)
                for name in ("ca.key", "ca.crt"):
                    shutil.copyfile(given / name, here / name)
                    (here / name).chmod(0o600 if name == "ca.key" else 0o644)
                ClusterCA.open(here, create=False)  # readable, one key for its certificate

            return await self.act(f"take the cluster CA from {given}", take)
        if present:
            try:
                ClusterCA.open(here, create=False)
            except CAError as exc:
                raise StepFailed(str(exc)) from None
            return "unchanged", f"the cluster CA in {self.lay.ca_dir}"

        async def make() -> None:
            ClusterCA.open(here, create=True)

        return await self.act(f"make the cluster CA in {self.lay.ca_dir}", make)

    async def certificates(self, m: Machine) -> Outcome:
        here = m.path(self.lay.ca_dir)
        names = ", ".join(self.addresses)
        if not (here / "ca.crt").exists():
            return "skipped", f"would issue the control plane's certificate for {names} (no CA yet)"
        ca = ClusterCA.open(here, create=False)
        kept = (here / "controller.crt").read_bytes() if (here / "controller.crt").exists() else b""
        if self.opts.dry_run:
            return "skipped", f"would make sure the control plane's certificate covers {names}"
        server = ca.controller_cert(self.addresses)  # kept while it covers them all (llmgw.adapters.ssh.ca)
        client = ca.router_cert(self.opts.name)
        lay = self.lay
        files = steps.control_plane_tls(lay, ca.cert_pem, server, client)
        if self.opts.node:
            nl, node = render.Layout(), ca.node_cert(self.opts.name)
            files += [
                RemoteFile(nl.tls_cert, node.cert_pem, 0o600),
                RemoteFile(nl.tls_key, node.key_pem, 0o600),
                RemoteFile(nl.tls_ca, ca.cert_pem, 0o600),
            ]
        written = await m.sync_files(files)
        if not written and server.cert_pem == kept:
            return "unchanged", f"serial {server.serial:x} covers {names}"
        self.dirty.update({"controller", "router", "agent"})
        return "changed", f"serial {server.serial:x} for {names}; wrote {len(written)} files"

    async def admin_token(self, m: Machine) -> Outcome:
        return await self._generated(m, self.lay.admin_token, "the admin token")

    async def cluster_secret(self, m: Machine) -> Outcome:
        """The secret the starter's Cluster names: kept here, not in the controller's state, so that a standby
        (`llmgw server add`) is given the same one."""
        return await self._generated(m, self.lay.cluster_secret, "the cluster secret")

    async def _generated(self, m: Machine, path: str, what: str) -> Outcome:
        if (m.read_text(path) or "").strip():
            return "unchanged", path
        file = RemoteFile(path, secrets.token_urlsafe(32).encode() + b"\n", 0o600)
        self.dirty.add("controller")
        return await self.act(f"generate {what} in {path}", lambda: m.put(file))

    async def repo(self, m: Machine) -> Outcome:
        if self.opts.repo is not None:
            return "unchanged", f"the controller follows {self.opts.repo}"
        if m.path(self.lay.repo + "/.git").exists():
            return "unchanged", f"the starter repo in {self.lay.repo}"
        source = self.opts.starter
        if source is None or not (source / "cluster.yaml").exists():
            raise StepFailed(
                f"no cluster repo: give --repo (a git URL or path) or --starter (a directory like the project's "
                f"examples/cluster-repo; {source} has no cluster.yaml)"
            )

        async def make() -> None:
            target = m.path(self.lay.repo)
            starter.write(source, target, self.settings, node=self.opts.name if self.opts.node else None)
            await m.run(starter.commit_command(self.lay.repo))

        return await self.act(f"make the starter repo in {self.lay.repo} from {source}", make)

    async def config(self, m: Machine) -> Outcome:
        lay, s = self.lay, self.settings
        files = {
            "controller": [
                RemoteFile(lay.controller_config, L.controller_config(lay, s), 0o640),
                RemoteFile(lay.unit_path("controller"), L.unit(lay, s, "controller"), 0o644),
            ],
            "router": [
                RemoteFile(lay.router_config, L.router_config(lay, s), 0o640),
                RemoteFile(lay.unit_path("router"), L.unit(lay, s, "router"), 0o644),
            ],
        }
        if self.opts.node:
            files["agent"] = self.services.agent_files()
        states = await m.file_states([f.path for fs in files.values() for f in fs])
        stale = {svc: [f for f in fs if states.get(f.path) != f.state] for svc, fs in files.items()}
        stale = {svc: fs for svc, fs in stale.items() if fs}
        if not stale:
            return "unchanged", ", ".join(f.path for fs in files.values() for f in fs)

        async def write() -> None:
            changed = [f for fs in stale.values() for f in fs]
            await m.put_many(changed)
            self.dirty.update(stale)
            if self.services.mode() == "systemd" and any(f.path.endswith(".service") for f in changed):
                await m.run("systemctl daemon-reload")

        return await self.act("write " + ", ".join(f.path for fs in stale.values() for f in fs), write)

    async def ownership(self, m: Machine) -> Outcome:
        return await steps.ownership(m, self.lay, self.act, node=self.opts.node)


async def init_machine(machine: Machine, opts: InitOptions) -> NodeResult:
    return await Init(machine, opts).run()
