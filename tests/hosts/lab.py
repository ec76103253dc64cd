"""A cluster across lab hosts: PostgreSQL on a host of its own, controllers (ha, one lease) on others, nodes with
their own sshd, agent and simulator engines, routers on yet others. Each service is a process of its host, its
state on the host's disk (`tmp/<host>/`), so a host powered off and booted again restarts from what it kept.

Reusable beyond the fault matrix (a server installer can `add_host` and ssh in as root with `ssh_argv`).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from controller.helpers import Repo, cluster_yaml
from faults.procs import _CONTROLLER_MAIN, http_status
from fixtures.postgres import PG_BIN_DIRS
from fixtures.sshd import keygen
from support import wait_until

from hosts.machine import Host, HostProc
from hosts.net import Lab
from llmgw.adapters.keys import hash_key

__all__ = ["ADMIN_TOKEN", "API_KEY", "HostLab", "drop_pg_template"]

ADMIN_TOKEN = "hosts-admin-token"
API_KEY = "sk-llmgw-" + "k" * 43
CONTROLLER_PORT = 8080
ROUTER_PORT = 8000
ENGINE_PORTS = (20000, 20099)  # every host has its own ports: the same range on each never collides


def _pg_bindir() -> Path:
    for d in PG_BIN_DIRS:
        if (Path(d) / "initdb").exists():
            return Path(d)
    found = shutil.which("initdb")
    if found is None:
        raise RuntimeError("PostgreSQL's initdb not found (scripts/install-system-deps.sh installs it)")
    return Path(found).parent


_PG_TEMPLATE: list[Path] = []  # this process's initdb'd data directory, copied per lab (initdb takes seconds)


def _pg_template(bindir: Path) -> Path:
    if not _PG_TEMPLATE:
        root = Path(tempfile.mkdtemp(prefix="llmgw-hosts-pgdata-"))
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        data = root / "data"
        argv = [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True, cwd=root)
        _PG_TEMPLATE.append(data)
    return _PG_TEMPLATE[0]


def drop_pg_template() -> None:
    """At the end of the session (tests/hosts/conftest.py)."""
    while _PG_TEMPLATE:
        shutil.rmtree(_PG_TEMPLATE.pop().parent, ignore_errors=True)


class HostLab:
    def __init__(self, tmp: Path, worker: str) -> None:
        self.tmp = tmp
        self.net = Lab(worker).open()
        self.hosts: dict[str, Host] = {}
        self.token_file = tmp / "admin-token"
        self.token_file.write_text(ADMIN_TOKEN + "\n")
        (tmp / "cluster-secret").write_text("hosts-cluster-secret\n")
        self.repo = Repo(tmp / "origin", use_git=True)
        self.dsn = ""
        self._pg_dir: Path | None = None
        self.client_key: Path | None = None
        self.routers: dict[str, HostProc] = {}

    # ------------------------------------------------------------------------------------ hosts

    def add_host(self, name: str) -> Host:
        ns = self.net.add_host(name)
        host = Host(name, ns, self.net.addresses[name], self.tmp / name).boot()
        self.hosts[name] = host
        return host

    def reboot(self, name: str) -> Host:
        """Power off (every process of the host killed at once), then boot with the same disk and address."""
        host = self.hosts[name]
        host.power_off()
        return host.boot()

    def close(self) -> None:
        if self.repo.git is not None:
            self.repo.git.close()  # GitPython's cat-file helpers, processes of this test
        for host in self.hosts.values():
            host.power_off()
        self.net.close()
        if self._pg_dir is not None:
            shutil.rmtree(self._pg_dir, ignore_errors=True)

    # ------------------------------------------------------------------------------------ services

    def start_postgres(self, name: str) -> str:
        """PostgreSQL as a process of host `name` (as the `postgres` account, data in a directory it owns, a
        copy of this process's one initdb); the DSN of a fresh database on it, reachable from every host and
        from the test."""
        host = self.hosts[name]
        bindir = _pg_bindir()
        self._pg_dir = Path(tempfile.mkdtemp(prefix="llmgw-hosts-pg-"))
        pw = pwd.getpwnam("postgres")
        os.chown(self._pg_dir, pw.pw_uid, pw.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
        data = self._pg_dir / "data"
        subprocess.run(["cp", "-a", str(_pg_template(bindir)), str(data)], check=True, capture_output=True)
        (data / "pg_hba.conf").write_text("host all all 0.0.0.0/0 trust\nlocal all all trust\n")
        server = [str(bindir / "postgres"), "-D", str(data), "-p", "5432", "-k", str(self._pg_dir)]
        opts = ["-c", f"listen_addresses={host.address}", "-c", "fsync=off", "-c", "full_page_writes=off"]
        host.start("postgres", [*as_pg, *server, *opts])
        admin = f"postgresql://postgres@{host.address}:5432/postgres"

        def accepts() -> bool:
            try:
                with psycopg.connect(admin, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("CREATE DATABASE llmgw")
                return True
            except psycopg.OperationalError:
                return False

        wait_until(accepts, 60, f"PostgreSQL on {name}")
        self.dsn = f"postgresql://postgres@{host.address}:5432/llmgw"
        return self.dsn

    def start_sshd(self, name: str, extra: tuple[str, ...] = ()) -> HostProc:
        """sshd on host `name`, port 22 of its own address; root logs in with the lab's client key. `extra`:
        more sshd_config lines (a ChrootDirectory: the host's own root file system)."""
        host = self.hosts[name]
        keys = self.tmp / "ssh"
        if self.client_key is None:
            keys.mkdir(exist_ok=True)
            self.client_key = keys / "client_ed25519"
            keygen(self.client_key)
            (keys / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
            (keys / "authorized_keys").chmod(0o600)
        host_key = host.disk / "ssh_host_ed25519"
        if not host_key.exists():
            keygen(host_key)
        config = host.disk / "sshd_config"
        lines = [
            "Port 22",
            f"ListenAddress {host.address}",
            f"HostKey {host_key}",
            f"AuthorizedKeysFile {keys / 'authorized_keys'}",
            f"PidFile {host.disk / 'sshd.pid'}",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            *extra,
        ]
        config.write_text("\n".join(lines) + "\n")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        proc = host.start("sshd", ["/usr/sbin/sshd", "-f", str(config), "-D", "-e"])
        return proc

    def ssh_argv(self, name: str, command: str) -> list[str]:
        assert self.client_key is not None, "start_sshd first"
        options = [
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ]
        return [
            "ssh",
            "-i",
            str(self.client_key),
            *options,
            "-o",
            "ConnectTimeout=2",
            "-p",
            "22",
            f"root@{self.hosts[name].address}",
            command,
        ]

    def controller_url(self, name: str) -> str:
        return f"http://{self.hosts[name].address}:{CONTROLLER_PORT}"

    def start_controller(self, name: str, **overrides: Any) -> HostProc:
        """A controller on host `name` (ha on the lab's PostgreSQL), state on the host's disk."""
        host = self.hosts[name]
        settings = {
            "repo": str(self.repo.path),
            "poll_s": 0.3,
            "store": self.dsn,
            "admin_token_file": str(self.token_file),
            "state_dir": str(host.disk / "controller-state"),
            "secrets_dir": str(self.tmp),
            "command_timeout_s": 10.0,
            "drain_s": 0.3,
            "backoff_base_s": 0.5,
            "settle_s": 20.0,
            "ha": True,
            "lease_ttl_s": 4.0,
            "lease_renew_s": 0.5,
            "listen": f"{host.address}:{CONTROLLER_PORT}",
            "metrics_listen": f"{host.address}:9090",
            **overrides,
        }
        argv = [sys.executable, "-c", _CONTROLLER_MAIN, json.dumps(settings)]
        proc = host.start("controller", argv)
        url = self.controller_url(name)
        wait_until(
            lambda: http_status(url + "/healthz") == 200 or not proc.alive(), 60, f"controller on {name}"
        )
        assert proc.alive(), f"controller on {name} exited:\n{proc.text()[-3000:]}"
        return proc

    def start_agent(self, name: str, controllers: list[str]) -> HostProc:
        """Node `name`'s agent on its host, told the controllers' addresses; its state on the host's disk."""
        host = self.hosts[name]
        inventory = host.disk / "inventory.json"
        inventory.write_text(json.dumps({"cpu_cores": 4, "memory_bytes": 16 * 1024**3, "gpus": []}))
        cfg = {
            "node": name,
            "controllers": [self.controller_url(c) for c in controllers],
            "token_file": str(self.token_file),
            "state_dir": str(host.disk / "agent-state"),
            "advertise_host": host.address,
            "bind_host": host.address,
            "port_range": list(ENGINE_PORTS),
            "inventory_override": str(inventory),
            "ready_timeout_s": 60,
            "stop_grace_s": 3,
            "max_backoff_s": 0.5,
        }
        config = host.disk / "agent.json"
        config.write_text(json.dumps(cfg))
        return host.start("agent", [sys.executable, "-m", "llmgw_agent.main", "run", "--config", str(config)])

    def start_sim(self, name: str, model: str, key: str, port: int = 21000) -> str:
        """A simulator engine serving `model` on host `name` (what an agent would start); its base URL."""
        host = self.hosts[name]
        argv = [sys.executable, "-m", "llmgw_agent.sim", "--host", host.address, "--port", str(port)]
        argv += ["--model", model, "--decode-ms-per-token", "1", "--prefill-ms-per-token", "0.01"]
        proc = host.start(f"sim-{model}", [*argv, "--max-concurrency", "8"], env={"VLLM_API_KEY": key})
        url = f"http://{host.address}:{port}"
        wait_until(lambda: http_status(url + "/health") == 200 or not proc.alive(), 30, f"{model} on {name}")
        assert proc.alive(), f"the simulator on {name} exited:\n{proc.text()[-3000:]}"
        return url

    def router_url(self, name: str) -> str:
        return f"http://{self.hosts[name].address}:{ROUTER_PORT}"

    def start_router(self, name: str, controllers: list[str], extra: list[str] | None = None) -> HostProc:
        """A router on host `name` following the controllers; one API key (project p1, key-1)."""
        keys = self.hosts[name].disk / "keys"
        keys.write_text(f"{hash_key(API_KEY)} p1 key-1\n")
        follow = [arg for c in controllers for arg in ("--controller", self.controller_url(c))]
        return self.start_router_with(name, [*follow, "--keys-file", str(keys), *(extra or [])])

    def start_router_with(self, name: str, args: list[str]) -> HostProc:
        """A router on host `name` with its source and keys in `args` (a snapshot file and a store, say)."""
        host = self.hosts[name]
        argv = [
            sys.executable,
            "-c",
            "from llmgw_router.main import main; main()",
            "--listen",
            f"{host.address}:{ROUTER_PORT}",
            "--metrics-listen",
            f"{host.address}:9000",
            "--state-dir",
            str(host.disk / "router-state"),
            "--token-file",
            str(self.token_file),
            *args,
        ]
        proc = host.start("router", argv)
        self.routers[name] = proc
        url = self.router_url(name)
        wait_until(lambda: http_status(url + "/health") == 200 or not proc.alive(), 60, f"router on {name}")
        assert proc.alive(), f"router on {name} exited:\n{proc.text()[-3000:]}"
        return proc

    # ------------------------------------------------------------------------------------ admin API

    def get(self, controller: str, path: str) -> Any:
        req = urllib.request.Request(
            self.controller_url(controller) + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def replicas(self, controller: str, model: str) -> list[dict[str, Any]] | None:
        """The model's replicas as the controller reports them; None when it does not answer."""
        try:
            items: list[dict[str, Any]] = self.get(controller, "/api/v1/replicas")["replicas"]
        except (urllib.error.URLError, OSError):
            return None
        return [r for r in items if r["model"] == model]

    def ready(self, controller: str, model: str, count: int) -> dict[str, tuple[str, int]] | None:
        """{replica id: (node, engine pid)} once exactly `count` replicas of `model` are ready; else None."""
        mine = self.replicas(controller, model)
        if mine is None or len(mine) != count or not all(r["state"] == "ready" and r["pid"] for r in mine):
            return None
        return {r["id"]: (",".join(r["nodes"]), r["pid"]) for r in mine}

    def events(self, controller: str, since: float) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get(controller, "/api/v1/events?limit=1000")["events"]
        return [e for e in items if e["time"] >= since]

    def node_state(self, controller: str, node: str) -> str | None:
        try:
            nodes = self.get(controller, "/api/v1/nodes")["nodes"]
        except (urllib.error.URLError, OSError):
            return None
        return next((str(n["state"]) for n in nodes if n["name"] == node), None)

    def cluster(self, unreachable: str = "2s", lost: str = "60s") -> None:
        """Commit the Cluster document (with the secret every controller derives engine keys from)."""
        self.repo.write(
            {"cluster.yaml": cluster_yaml(unreachable, lost) + "  secret: {file: cluster-secret}\n"}
        )

    def leadership(self, controller: str) -> dict[str, Any] | None:
        try:
            lead: dict[str, Any] = self.get(controller, "/api/v1/status")["leadership"]
        except (urllib.error.URLError, OSError, KeyError):
            return None
        return lead

    def role(self, controller: str) -> str | None:
        try:
            return str(self.get(controller, "/api/v1/status")["leadership"]["role"])
        except (urllib.error.URLError, OSError, KeyError):
            return None
