"""`llmgw server add`: a standby controller and/or another router on another machine, over SSH, run on the
machine `llmgw server init` installed.

The other machine is walked as node bootstrap walks a node (llmgw.adapters.ssh.bootstrap: `run_on_node` connects
with the host key checked, `run_steps` records each step): every step looks before it acts, a second run records
every step `unchanged`, and `dry_run` only says what it would do. The machines share what a cluster shares: the
CA (its key too, for a standby that may come to lead), the admin token, the cluster secret, and the store: this
machine's PostgreSQL is opened to the other one's address (store_access), and the other one logs in with the
password kept in this machine's secrets directory. The other machine gets its own certificate for its own
addresses, and its router follows its own controller first, then this machine's.
"""

from __future__ import annotations

import ipaddress
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from ruamel.yaml import YAML

from llmgw.adapters.server import layout as L, steps, store_access
from llmgw.adapters.server.machine import Machine, addresses_from, first_routable_ipv4
from llmgw.adapters.server.options import AddOptions
from llmgw.adapters.server.remote_services import RemoteServices
from llmgw.adapters.server.services import fetch_token
from llmgw.adapters.server.steps import Outcome
from llmgw.adapters.ssh.bootstrap import NodeResult, run_on_node, run_steps
from llmgw.adapters.ssh.ca import ClusterCA
from llmgw.adapters.ssh.remote import Remote, RemoteFile, StepFailed

RemoteStep = Callable[[Remote], Awaitable[Outcome]]
_SEEN = "cat /etc/os-release; echo; id -u; [ -d /run/systemd/system ] && echo systemd=yes; true"
_ADDRESSES = "ip -o addr show; echo '--'; hostname; hostname -f 2>/dev/null; true"


class Add(steps.Walk):
    """One run of add: this machine's control plane read, the other machine's steps in order."""

    def __init__(self, here: Machine, opts: AddOptions, lay: L.ServerLayout | None = None) -> None:
        super().__init__(opts.target.node, opts.dry_run, opts.on_step)
        self.here, self.opts = here, opts
        self.lay = lay or L.ServerLayout()
        self.dirty: set[str] = set()  # the other machine's services whose inputs this run changed
        self.mode: Literal["systemd", "process"] = "process"
        self.address = ""  # the other machine's address (the one it is dialed at)
        self.addresses: list[str] = []  # every address and name of the other machine, for its certificate
        self.first: dict[str, Any] = {}  # this machine's controller settings
        self.first_host = ""  # this machine's address, as its controller advertises it

    def steps(self) -> list[tuple[str, RemoteStep]]:
        chosen: list[tuple[str, RemoteStep]] = [
            ("check", self.check),
            ("first", self.first_machine),
            ("store-access", self.store_access),
            ("packages", lambda r: steps.packages(r, ["git"], self.act)),
            ("account", lambda r: steps.account(r, self.lay, self.act)),
            ("directories", self.directories),
            ("certificates", self.certificates),
            ("secrets", self.secrets),
            ("store", self.store),
            ("config", self.config),
            ("ownership", lambda r: steps.ownership(r, self.lay, self.act, node=False)),
        ]
        if self.opts.controller:
            chosen.append(
                ("controller", lambda r: self.services(r).service("controller", "controller" in self.dirty))
            )
        if self.opts.router:
            chosen.append(("router-token", self.router_token))
            chosen.append(("router", lambda r: self.services(r).service("router", "router" in self.dirty)))
        return chosen

    async def run(self) -> NodeResult:
        async def body(r: Remote) -> None:
            await run_steps(r, self.steps(), self.record)

        return await run_on_node(self.opts.target, self.result, self.record, self.steps, body)

    # ------------------------------------------------------------------------------------------ steps

    async def check(self, r: Remote) -> Outcome:
        if not (self.opts.controller or self.opts.router):
            raise StepFailed("nothing to add: give a controller, a router or both")
        seen = await r.run(_SEEN)
        release, _, rest = seen.partition("\n\n")
        lines = rest.split()
        name = steps.debian_or_ubuntu(release, "llmgw server add", self.opts.target.host)
        if not lines or lines[0] != "0":
            raise StepFailed(
                f"{self.opts.target.where} is not root: log in as root (it adds an account, units)"
            )
        wanted = ["llmgw-router"] + (["llmgw"] if self.opts.controller else [])
        code, _ = await r.status(" && ".join(f"test -x {self.opts.bin_dir}/{b}" for b in wanted))
        if code != 0:
            raise StepFailed(
                f"{' and '.join(wanted)} not found in {self.opts.bin_dir} on {self.opts.target.host}: install llmgw "
                "there (the same version as here) and give --bin-dir, the directory holding its executables"
            )
        self.mode = (
            self.opts.service
            if self.opts.service != "auto"
            else ("systemd" if "systemd=yes" in lines else "process")
        )
        ip_out, _, names = (await r.run(_ADDRESSES)).partition("--")
        self.addresses = sorted({*addresses_from(ip_out, names.split()), *self.opts.addresses})
        self.address = (
            self.opts.advertise or _ip_or_none(self.opts.target.host) or first_routable_ipv4(self.addresses)
        )
        # Its own address (a minimal system may lack `ip`), and the listen address: the controller adds that
        # to the certificate it is given when it starts (llmgw.controller.app.tls_setup), init covers it too.
        listen = L.ServerSettings(repo="", bin_dir="", router_name="").listen_host
        self.addresses = sorted({*self.addresses, self.address, listen})
        how = "systemd units" if self.mode == "systemd" else "no systemd running: services run as processes"
        return "unchanged", f"{name}, {how}, dialed at {self.address}, llmgw in {self.opts.bin_dir}"

    async def first_machine(self, r: Remote) -> Outcome:
        """This machine's control plane, as `llmgw server init` left it: what the other one is given."""
        text = self.here.read_text(self.lay.controller_config)
        if text is None:
            raise StepFailed(
                f"no {self.lay.controller_config} here: run `llmgw server init` on this machine first"
            )
        self.first = dict(YAML(typ="safe").load(text) or {})
        missing = [
            p
            for p in (
                self.lay.admin_token,
                self.lay.cluster_secret,
                self.lay.store_dsn,
                f"{self.lay.ca_dir}/ca.key",
            )
            if not (self.here.read_text(p) or "").strip()
        ]
        if missing:
            raise StepFailed(
                f"{', '.join(missing)} missing here: run `llmgw server init` on this machine first"
            )
        if not self.first.get("ha"):
            raise StepFailed(
                "the controller here holds no lease (its store is not PostgreSQL): a standby needs the store "
                "both controllers share; move it (`llmgw store move`) and run `llmgw server init --store DSN`"
            )
        self.first_host = str(self.first.get("advertise", "")).removeprefix("https://").rsplit(":", 1)[0]
        repo = self.repo()
        if self.opts.controller and "://" not in repo and not repo.startswith("git@"):
            raise StepFailed(
                f"the controller here follows {repo}, a path on this machine the standby cannot reach: give "
                "--repo, a git URL both machines reach (and point this one at it: `llmgw server init --repo URL`)"
            )
        return "unchanged", f"the controller here ({self.first_host}) follows {repo}"

    def repo(self) -> str:
        return self.opts.repo or str(self.first.get("repo", ""))

    def dsn(self) -> str:
        """The store's DSN as the other machine reaches it."""
        dsn = (self.here.read_text(self.lay.store_dsn) or "").strip()
        return store_access.dsn_for(dsn, self.first_host) if store_access.is_local(dsn) else dsn

    async def store_access(self, r: Remote) -> Outcome:
        dsn = (self.here.read_text(self.lay.store_dsn) or "").strip()
        if not store_access.is_local(dsn):
            return (
                "unchanged",
                "the store is not this machine's: the other one must reach it as this one does",
            )
        address = _ip_or_none(self.address)
        if address is None:
            raise StepFailed(
                f"PostgreSQL lets machines in by address: give --advertise, {self.address}'s IP address"
            )
        return await store_access.open_store(self.here, self.first_host, address, self.here.systemd, self.act)

    async def directories(self, r: Remote) -> Outcome:
        wanted = steps.wanted_dirs(self.lay, node=False, process_mode=self.mode == "process")
        return await steps.directories(r, wanted, self.act)

    async def certificates(self, r: Remote) -> Outcome:
        """The other machine's own certificate (its addresses) and router certificate, issued here by the CA
        (in a scratch copy: this machine's certificates stay as they are), kept there while they cover it."""
        lay = self.lay
        pairs = {  # the other machine's file (written in either role): the name the CA keeps it under
            lay.server_cert: "controller.crt",
            lay.server_key: "controller.key",
            lay.router_client_cert: f"routers/{self.opts.name}.crt",
            lay.router_client_key: f"routers/{self.opts.name}.key",
        }
        with tempfile.TemporaryDirectory(prefix="llmgw-add-") as scratch:
            tmp = Path(scratch)
            for name in ("ca.key", "ca.crt"):
                shutil.copyfile(self.here.path(f"{lay.ca_dir}/{name}"), tmp / name)
            for there, kept in pairs.items():
                code, text = await r.status(f"cat {there}")
                if code == 0 and text.startswith("-----BEGIN"):
                    (tmp / kept).parent.mkdir(exist_ok=True)
                    (tmp / kept).write_text(text)
            ca = ClusterCA.open(tmp, create=False)
            server = ca.controller_cert(self.addresses)
            client = ca.router_cert(self.opts.name)
        files = steps.control_plane_tls(lay, ca.cert_pem, server, client)
        if self.opts.controller:  # what the standby serves its agents and routers with
            files += [
                RemoteFile(f"{lay.ca_dir}/controller.crt", server.cert_pem, 0o644),
                RemoteFile(f"{lay.ca_dir}/controller.key", server.key_pem, 0o600),
            ]
        return await self._sync(r, files, f"serial {server.serial:x} for {', '.join(self.addresses)}")

    async def secrets(self, r: Remote) -> Outcome:
        """The admin token, the cluster secret and the CA for a standby (it may come to lead); the store's DSN."""
        lay, here = self.lay, self.here
        files = [RemoteFile(lay.store_dsn, self.dsn().encode() + b"\n", 0o600)]
        if self.opts.controller:
            files += [
                RemoteFile(lay.admin_token, here.path(lay.admin_token).read_bytes(), 0o600),
                RemoteFile(lay.cluster_secret, here.path(lay.cluster_secret).read_bytes(), 0o600),
                RemoteFile(f"{lay.ca_dir}/ca.key", here.path(f"{lay.ca_dir}/ca.key").read_bytes(), 0o600),
                RemoteFile(f"{lay.ca_dir}/ca.crt", here.path(f"{lay.ca_dir}/ca.crt").read_bytes(), 0o644),
            ]
        what = "the CA, the admin token, the cluster secret, " if self.opts.controller else ""
        return await self._sync(r, files, f"{what}the store's DSN ({lay.secrets})")

    async def store(self, r: Remote) -> Outcome:
        """The other machine logs in to the store, with its interpreter and the DSN it was given."""
        if self.opts.dry_run:
            return "skipped", "would log in to the store from there"
        check = "import sys, psycopg; psycopg.connect(sys.stdin.read().strip(), connect_timeout=10).close()"
        py = f"$(sed -n '1s/^#!//p' {self.opts.bin_dir}/llmgw-router)"
        code, out = await r.status(f"{py} -c '{check}' < {self.lay.store_dsn}")
        if code != 0:
            raise StepFailed(f"{self.opts.target.host} cannot log in to the store: {out.strip()[-400:]}")
        return "unchanged", f"{L.USER} logs in to the store from {self.address}"

    def settings(self) -> L.ServerSettings:
        first = f"{self.first_host}:{L.CONTROLLER_PORT}"
        own = self.opts.controller
        return L.ServerSettings(
            repo=self.repo(),
            bin_dir=self.opts.bin_dir,
            router_name=self.opts.name,
            # A router alone follows this machine's controller; beside a standby, its own first.
            advertise=self.address if own else self.first_host,
            environment=dict(self.opts.environment),
            ha=True,
            peers=(first,) if own else (),
        )

    async def config(self, r: Remote) -> Outcome:
        lay, s = self.lay, self.settings()
        files: dict[str, list[RemoteFile]] = {}
        if self.opts.controller:
            files["controller"] = [
                RemoteFile(lay.controller_config, L.controller_config(lay, s), 0o640),
                RemoteFile(lay.unit_path("controller"), L.unit(lay, s, "controller"), 0o644),
            ]
        if self.opts.router:
            files["router"] = [
                RemoteFile(lay.router_config, L.router_config(lay, s), 0o640),
                RemoteFile(lay.unit_path("router"), L.unit(lay, s, "router"), 0o644),
            ]
        every = [f for fs in files.values() for f in fs]
        states = await r.file_states([f.path for f in every])
        stale = [f for f in every if states.get(f.path) != f.state]
        if not stale:
            return "unchanged", ", ".join(f.path for f in every)

        async def write() -> None:
            await r.put_many(stale)
            self.dirty.update(svc for svc, fs in files.items() if any(f in stale for f in fs))
            if self.mode == "systemd":
                await r.run("systemctl daemon-reload")

        return await self.act("write " + ", ".join(f.path for f in stale), write)

    async def router_token(self, r: Remote) -> Outcome:
        """The token routers present, from the controller here (the cluster secret's, the same for every one)."""
        if self.opts.dry_run:
            return (
                "skipped",
                f"would fetch the router token from the controller here into {self.lay.router_token}",
            )
        admin = (self.here.read_text(self.lay.admin_token) or "").strip()
        url = f"https://127.0.0.1:{L.CONTROLLER_PORT}/api/v1/credentials/router"
        token = await fetch_token(url, self.here.path(self.lay.ca_cert), admin, self.opts.health_timeout)
        file = RemoteFile(self.lay.router_token, token.encode() + b"\n", 0o600)
        if not await r.sync_files([file]):
            return "unchanged", self.lay.router_token
        await r.run(f"chown {L.USER}:{L.USER} {self.lay.router_token}")
        self.dirty.add("router")
        return "changed", f"wrote {self.lay.router_token}"

    def services(self, r: Remote) -> RemoteServices:
        return RemoteServices(
            r,
            self.lay,
            self.settings(),
            self.mode,
            self.address,
            self.here.path(self.lay.ca_cert),
            self.opts.dry_run,
            self.opts.health_timeout,
        )

    async def _sync(self, r: Remote, files: list[RemoteFile], what: str) -> Outcome:
        states = await r.file_states([f.path for f in files])
        stale = [f for f in files if states.get(f.path) != f.state]
        if not stale:
            return "unchanged", what

        async def write() -> None:
            await r.put_many(stale)
            self.dirty.update(("controller", "router"))

        return await self.act(f"write {len(stale)} of {len(files)} files: {what}", write)


def _ip_or_none(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


async def add_machine(here: Machine, opts: AddOptions) -> NodeResult:
    return await Add(here, opts).run()
