"""What `llmgw server init` writes on a control-plane machine, as pure functions of its settings: the paths, the
controller's and router's settings files, their units and the commands those units run.

Rendering is deterministic (sorted keys, no timestamps) so a second init produces the same bytes and finds
nothing to write. Every path is the machine's (absolute, under `/`); `Machine` maps them under its root.
"""

from __future__ import annotations

import io
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from ruamel.yaml import YAML

from llmgw.adapters.ssh import render

USER = (
    render.AGENT_USER
)  # one unprivileged account runs the controller, the router and (with --node) the agent
CONTROLLER_PORT = 7070
ROUTER_PORT = 8443


@dataclass(frozen=True)
class ServerLayout:
    """Where the control plane lives on the machine."""

    etc: str = "/etc/llmgw"
    state: str = "/var/lib/llmgw"
    log: str = "/var/log/llmgw"
    run: str = "/run/llmgw"
    units: str = "/etc/systemd/system"

    @property
    def secrets(self) -> str:
        """The admin token, the store's DSN (its password), the router token; provider keys the repo names."""
        return f"{self.etc}/secrets"

    @property
    def tls(self) -> str:
        return f"{self.etc}/tls"

    @property
    def server_cert(self) -> str:
        """The control plane's certificate (every address of the machine), which the router serves."""
        return f"{self.tls}/server.crt"

    @property
    def server_key(self) -> str:
        return f"{self.tls}/server.key"

    @property
    def ca_cert(self) -> str:
        return f"{self.tls}/ca.crt"

    @property
    def router_client_cert(self) -> str:
        """The router's client certificate (router:NAME) for the controller's router stream."""
        return f"{self.tls}/router.crt"

    @property
    def router_client_key(self) -> str:
        return f"{self.tls}/router.key"

    @property
    def controller_state(self) -> str:
        return f"{self.state}/controller"

    @property
    def ca_dir(self) -> str:
        """The cluster CA: the controller's default place for it (llmgw.controller.app.default_ca_dir)."""
        return f"{self.controller_state}/ca"

    @property
    def router_state(self) -> str:
        return f"{self.state}/router"

    @property
    def repo(self) -> str:
        """The starter cluster repo, when init makes one."""
        return f"{self.state}/repo"

    @property
    def controller_config(self) -> str:
        return f"{self.etc}/controller.yaml"

    @property
    def router_config(self) -> str:
        return f"{self.etc}/router.yaml"

    @property
    def admin_token(self) -> str:
        return f"{self.secrets}/admin-token"

    @property
    def cluster_secret(self) -> str:
        """What engine keys and tokens derive from: one file, the same on every controller (the starter's Cluster
        names it as `secret: {file: cluster-secret}`, read from the secrets directory)."""
        return f"{self.secrets}/cluster-secret"

    @property
    def store_dsn(self) -> str:
        return f"{self.secrets}/store.dsn"

    @property
    def router_token(self) -> str:
        return f"{self.secrets}/router-token"

    def unit_path(self, service: str) -> str:
        return f"{self.units}/llmgw-{service}.service"

    def pid_file(self, service: str) -> str:
        return f"{self.run}/{service}.pid"

    def log_file(self, service: str) -> str:
        return f"{self.log}/{service}.log"

    def owned(self) -> list[str]:
        """Directories the service account owns (writes): its state, its logs, the secrets it reads alone."""
        return [self.state, self.log, self.secrets]

    def shared(self) -> list[str]:
        """Directories root owns and the account may read (group llmgw): its settings and certificates."""
        return [self.etc, self.tls]


@dataclass(frozen=True)
class ServerSettings:
    """What the controller and router of this machine are told (the machine's side: the repo says the rest)."""

    repo: str  # git URL or path the controller follows
    bin_dir: str  # where the `llmgw`, `llmgw-router` (and `llmgw-agent`) executables are
    router_name: str
    listen_host: str = "0.0.0.0"
    controller_port: int = CONTROLLER_PORT
    router_port: int = ROUTER_PORT
    advertise: str = "127.0.0.1"  # the address the router and agents dial the controller at
    environment: Mapping[str, str] = field(default_factory=dict)  # NAME=VALUE every service is given
    # On a PostgreSQL store the controller holds a lease there, so a standby (`llmgw server add`) can join.
    ha: bool = False
    peers: tuple[str, ...] = ()  # other controllers (host:port) the router follows after this machine's own

    @property
    def controller_listen(self) -> str:
        return f"{self.listen_host}:{self.controller_port}"

    @property
    def router_listen(self) -> str:
        return f"{self.listen_host}:{self.router_port}"

    @property
    def controller_address(self) -> str:
        return f"{self.advertise}:{self.controller_port}"


def _yaml(doc: Mapping[str, object]) -> bytes:
    out = io.StringIO()
    dumper = YAML(typ="safe")
    dumper.default_flow_style = False
    dumper.dump({k: doc[k] for k in sorted(doc)}, out)
    return out.getvalue().encode()


def controller_config(lay: ServerLayout, s: ServerSettings) -> bytes:
    """The controller's settings file (llmgw.controller.parts.settings.ControllerOptions)."""
    ha: dict[str, object] = {"ha": True, "advertise": f"https://{s.controller_address}"} if s.ha else {}
    return _yaml(
        {
            **ha,
            "repo": s.repo,
            "store": "@" + lay.store_dsn,
            "listen": s.controller_listen,
            "metrics_listen": "127.0.0.1:9090",
            "state_dir": lay.controller_state,
            "secrets_dir": lay.secrets,
            "admin_token_file": lay.admin_token,
            "ca_dir": lay.ca_dir,
            "console_router_url": f"https://{s.advertise}:{s.router_port}/v1",
        }
    )


def router_config(lay: ServerLayout, s: ServerSettings) -> bytes:
    """The router's settings file (`llmgw-router --config`): TLS on the API, the controller over mutual TLS."""
    return _yaml(
        {
            "controller": [f"https://{a}" for a in (s.controller_address, *s.peers)],
            "controller_ca": lay.ca_cert,
            "controller_cert": lay.router_client_cert,
            "controller_key": lay.router_client_key,
            "token_file": lay.router_token,
            "store": "@" + lay.store_dsn,
            "listen": s.router_listen,
            "metrics_listen": "127.0.0.1:9091",
            "state_dir": lay.router_state,
            "secrets_dir": lay.secrets,
            "router_id": s.router_name,
            "tls_cert": lay.server_cert,
            "tls_key": lay.server_key,
        }
    )


def exec_argv(lay: ServerLayout, s: ServerSettings, service: str) -> list[str]:
    """The command a service's unit runs, and what init starts itself where systemd does not run."""
    if service == "controller":
        return [f"{s.bin_dir}/llmgw", "controller", "--config", lay.controller_config]
    if service == "router":
        return [f"{s.bin_dir}/llmgw-router", "--config", lay.router_config]
    if service == "agent":
        return [f"{s.bin_dir}/llmgw-agent", "run", "--config", render.Layout().config]
    raise ValueError(f"no such service: {service}")


def _protect_home(bin_dir: str) -> str:
    # ProtectHome=yes would hide an interpreter installed under /root or /home (a venv made there).
    return "read-only" if bin_dir.startswith(("/root/", "/home/")) else "yes"


def unit(lay: ServerLayout, s: ServerSettings, service: str) -> bytes:
    """The controller's or router's unit: the agent's sandbox (llmgw.adapters.ssh.render), its own paths."""
    argv = shlex.join(exec_argv(lay, s, service))
    env = tuple(f"{k}={v}" for k, v in sorted(s.environment.items()))
    if service == "agent":
        nl = render.Layout()
        return render.sandboxed_unit(
            f"llmgw agent (node {s.router_name})",
            argv,
            home=nl.state,
            read_write=(nl.state, nl.weights),
            service_extra="Restart=always\nRestartSec=2\nKillMode=process\n",
            environment=env,
            protect_home=_protect_home(s.bin_dir),
        )
    state = lay.controller_state if service == "controller" else lay.router_state
    # The controller writes its state (clone, CA, node certificates) and the starter repo (apply); the router
    # writes its usage spool and grace ledger. Many clients each hold a connection: a limit far above 1024.
    rw = (state, lay.repo) if service == "controller" else (state,)
    extra = "Restart=always\nRestartSec=2\nLimitNOFILE=65536\nTimeoutStopSec=120\n"
    if service == "router":
        extra += f"InaccessiblePaths=-{lay.controller_state}\n"  # the CA's key is the controller's alone
    return render.sandboxed_unit(
        f"llmgw {service}",
        argv,
        home=state,
        read_write=rw,
        service_extra=extra,
        environment=env,
        protect_home=_protect_home(s.bin_dir),
    )
