"""What bootstrap writes on a node, as pure functions of the settings: paths, agent config, unit, supervisor.

Rendering is deterministic (sorted keys, no timestamps) so a second bootstrap produces the same bytes and the
hash comparison finds nothing to write.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

# The unprivileged account the agent and its engines run as wherever bootstrap logs in as root.
AGENT_USER = "llmgw"


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be an install prefix (teardown removes paths under it, as root), or None."""
    if not prefix.startswith("/"):
        return f"node prefix {prefix!r} must be an absolute path (e.g. /opt/llmgw)"
    if any(c.isspace() or c == "\0" for c in prefix):
        return f"node prefix {prefix!r} must not contain whitespace (e.g. /opt/llmgw)"
    parts = [p for p in prefix.split("/") if p]
    if not parts:
        return "node prefix '/' would put the agent's directories at the root: give a directory such as /opt/llmgw"
    if any(p in (".", "..") for p in parts):
        return f"node prefix {prefix!r} must not contain `.` or `..` segments (e.g. /opt/llmgw)"
    return None


@dataclass(frozen=True)
class Layout:
    """Where everything lives under the install prefix on a node (default /opt/llmgw)."""

    prefix: str = "/opt/llmgw"
    unit_name: str = "llmgw-agent"

    def __post_init__(self) -> None:
        problem = prefix_problem(self.prefix)
        if problem:
            raise ValueError(problem)
        object.__setattr__(self, "prefix", self.prefix.rstrip("/"))

    @property
    def wheels(self) -> str:
        return f"{self.prefix}/wheels"

    @property
    def venv(self) -> str:
        return f"{self.prefix}/venv"

    @property
    def venvs(self) -> str:
        """Where upgrades install each wheelhouse in a venv of its own; `venv` becomes a link to the one in use."""
        return f"{self.prefix}/venvs"

    def venv_for(self, digest: str) -> str:
        return f"{self.venvs}/{digest[:16]}"

    @property
    def agent_bin(self) -> str:
        return f"{self.venv}/bin/llmgw-agent"

    @property
    def installed_marker(self) -> str:
        return f"{self.venv}/.llmgw-wheelhouse"

    @property
    def etc(self) -> str:
        return f"{self.prefix}/etc"

    @property
    def config(self) -> str:
        return f"{self.etc}/agent.json"

    @property
    def tls_cert(self) -> str:
        return f"{self.etc}/tls/agent.crt"

    @property
    def tls_key(self) -> str:
        return f"{self.etc}/tls/agent.key"

    @property
    def tls_ca(self) -> str:
        return f"{self.etc}/tls/ca.crt"

    @property
    def token(self) -> str:
        return f"{self.etc}/token"

    @property
    def state(self) -> str:
        return f"{self.prefix}/state"

    @property
    def models(self) -> str:
        return f"{self.prefix}/models"

    @property
    def weights(self) -> str:
        return f"{self.prefix}/weights"

    @property
    def supervisor(self) -> str:
        return f"{self.prefix}/bin/llmgw-agent-supervise"

    @property
    def run(self) -> str:
        return f"{self.prefix}/run"

    @property
    def supervisor_pid(self) -> str:
        return f"{self.run}/supervisor.pid"

    @property
    def log(self) -> str:
        return f"{self.prefix}/log/agent.log"

    @property
    def unit_path(self) -> str:
        return f"/etc/systemd/system/{self.unit_name}.service"

    def removable(self) -> list[str]:
        """What teardown removes; weights and models stay unless asked."""
        return [
            self.venv,
            self.venvs,
            self.wheels,
            self.etc,
            self.state,
            f"{self.prefix}/bin",
            self.run,
            f"{self.prefix}/log",
        ]

    def kept(self) -> list[str]:
        return [self.weights, self.models]


@dataclass(frozen=True)
class AgentSettings:
    """What goes into the agent's config file (llmgw_agent.config.AgentConfig, JSON)."""

    node: str
    controllers: tuple[str, ...]
    tls: bool  # client certificate files under etc/tls
    token: bool  # bearer token in etc/token (alone in development; beside TLS where the hub wants both)
    advertise_host: str
    labels: Mapping[str, str] = field(default_factory=dict)
    # Where the agent's pass-through listens: None is advertise_host; "0.0.0.0" only by the Node's opt-in.
    bind_host: str | None = None
    engines: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    metrics_listen: str | None = None  # the node-health listener (Node spec.agent.metrics_listen); None: none


def agent_config(layout: Layout, settings: AgentSettings) -> bytes:
    doc: dict[str, object] = {
        "node": settings.node,
        "controllers": list(settings.controllers),
        "state_dir": layout.state,
        "model_dirs": [layout.models],
        "weights_dir": layout.weights,
        "advertise_host": settings.advertise_host,
        "labels": dict(settings.labels),
        "engines": {name: dict(conf) for name, conf in settings.engines.items()},
    }
    if settings.bind_host is not None:
        doc["bind_host"] = settings.bind_host
    if settings.metrics_listen is not None:
        doc["metrics_listen"] = settings.metrics_listen
    if settings.tls:
        doc["tls"] = {"cert": layout.tls_cert, "key": layout.tls_key, "ca": layout.tls_ca}
    if settings.token:
        doc["token_file"] = layout.token
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def systemd_unit(layout: Layout, node: str, *, gpus: bool = False, exec_start: str | None = None) -> bytes:
    """The agent's unit. Engines are the agent's children, so they inherit its user and its sandbox.

    KillMode=process: stopping or restarting the agent leaves its engines running; the next agent re-adopts
    them (the agent is built for that), so an agent upgrade does not drop replicas. The sandbox is
    `sandboxed_unit`'s; the agent writes only its state directory (work dirs, engine logs, shard records) and
    the weights cache. `exec_start` replaces the bootstrapped venv's agent (an agent installed beside the control
    plane by `llmgw server init --node`).
    """
    return sandboxed_unit(
        f"llmgw agent (node {node})",
        exec_start or f"{layout.agent_bin} run --config {layout.config}",
        home=layout.state,
        read_write=(layout.state, layout.weights),
        gpus=gpus,
        service_extra="Restart=always\nRestartSec=2\nKillMode=process\n",
    )


def _devices(gpus: bool) -> str:
    if not gpus:
        return "PrivateDevices=yes\n"
    return (
        "DevicePolicy=closed\n"
        "DeviceAllow=char-nvidia-frontend rw\n"
        "DeviceAllow=char-nvidia-uvm rw\n"
        "DeviceAllow=char-nvidia-caps rw\n"
        "DeviceAllow=char-nvidia-nvswitch rw\n"
    )


def sandboxed_unit(
    description: str,
    exec_start: str,
    *,
    home: str,
    read_write: tuple[str, ...],
    gpus: bool = False,
    service_extra: str = "",
    environment: tuple[str, ...] = (),
    protect_home: str = "yes",
) -> bytes:
    """A unit for one of llmgw's services (agent, controller, router), each in the same sandbox: the
    unprivileged `llmgw` user, no privilege gain (setuid binaries do nothing), the whole file system read-only
    except `read_write`, a private /tmp, no home directories (`protect_home` read-only when the interpreter
    itself lives under one), no capabilities; devices are the standard pseudo-devices plus, on GPU nodes, the
    NVIDIA ones. `environment` lines are `NAME=VALUE`."""
    devices = _devices(gpus)
    env = "".join(f"Environment={line}\n" for line in environment)
    return f"""[Unit]
Description={description}
After=network-online.target
Wants=network-online.target

[Service]
User={AGENT_USER}
Group={AGENT_USER}
Environment=HOME={home}
{env}ExecStart={exec_start}
{service_extra}UMask=0077
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={" ".join(read_write)}
ProtectHome={protect_home}
PrivateTmp=yes
{devices}CapabilityBoundingSet=
AmbientCapabilities=
RestrictSUIDSGID=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictNamespaces=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native

[Install]
WantedBy=multi-user.target
""".encode()


# Whether the process $pid names runs: `kill -0` also succeeds on a zombie no one has reaped yet.
_RUNNING = '[ -e "/proc/$pid" ] && ! grep -q "^State:[[:space:]]*Z" "/proc/$pid/status" 2>/dev/null'
AGENT_STOP_GRACE_S = 10  # below the 15 s `stop_supervisor_command` gives the supervisor


def supervisor_script(layout: Layout, stop_grace_s: int = AGENT_STOP_GRACE_S) -> bytes:
    """A small restart loop for machines without systemd: restarts the agent with backoff; on TERM stops the
    agent first (SIGKILL after `stop_grace_s`: an agent that ignores TERM must not outlive its loop)."""
    q = shlex.quote
    return f"""#!/bin/sh
# Written by llmgw bootstrap: keeps the agent running where systemd does not.
umask 077
agent_pid=
stop() {{
    if [ -n "$agent_pid" ]; then
        pid=$agent_pid
        kill -TERM "$pid" 2>/dev/null; i=0
        while {_RUNNING} && [ $i -lt {stop_grace_s * 10} ]; do sleep 0.1; i=$((i+1)); done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid"
    fi
    exit 0
}}
trap stop TERM INT
delay=1
while :; do
    started=$(date +%s)
    {q(layout.agent_bin)} run --config {q(layout.config)} &
    agent_pid=$!
    wait "$agent_pid"
    status=$?
    agent_pid=
    echo "llmgw-agent-supervise: agent exited with status $status; restarting in ${{delay}}s" >&2
    # A run that lasted a minute was healthy: start the backoff over.
    if [ $(( $(date +%s) - started )) -ge 60 ]; then delay=1; fi
    sleep "$delay"
    delay=$(( delay * 2 )); if [ "$delay" -gt 30 ]; then delay=30; fi
done
""".encode()


def remove_command(paths: list[str]) -> str:
    """Remove those of `paths` that exist; print each removed path followed by a NUL.

    The paths are quoted into the script and never re-read from its output, so no path is ever split at a
    space into others (`/opt/my llmgw` must not become `rm -rf /opt/my`)."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return (
        f'for p in {quoted}; do if [ -e "$p" ]; then rm -rf -- "$p" && printf \'%s\\0\' "$p"; fi; done; true'
    )


def account_command(layout: Layout) -> str:
    """Run as root: create the agent's account if missing, own what it writes, let it reach the prefix.

    Prints `created` and `owned` when it changed something, so a second bootstrap reports `unchanged`. The
    venv, wheels and scripts stay root's: the agent cannot rewrite its own code. Fails, saying why, when the
    account cannot reach the prefix (a parent directory it may not search)."""
    q = shlex.quote
    u = AGENT_USER
    # The run and log dirs stay root's: only root's shell writes the pid file and opens the log.
    owned = " ".join(q(p) for p in (layout.etc, layout.state, layout.weights))
    return (
        f"if ! id -u {u} >/dev/null 2>&1; then\n"
        f"  shell=$(command -v nologin || echo /bin/false)\n"
        f'  useradd --system --user-group --home-dir {q(layout.state)} --no-create-home --shell "$shell" {u}'
        f" || exit 1\n"
        f"  echo created\n"
        f"fi\n"
        f"mkdir -p {owned} {q(layout.models)} || exit 1\n"
        f'if [ -n "$(find {owned} \\( ! -user {u} -o ! -group {u} \\) -print -quit)" ]; then\n'
        f"  chown -R {u}:{u} {owned} || exit 1\n"
        f"  echo owned\n"
        f"fi\n"
        f'if [ "$(stat -c %G {q(layout.prefix)})" != {u} ]; then chgrp {u} {q(layout.prefix)} && echo owned; fi\n'
        f"chmod g+x,o-rwx {q(layout.prefix)} || exit 1\n"
        f"as_agent='setpriv --reuid={u} --regid={u} --init-groups'\n"
        f"$as_agent test -r {q(layout.config)} || "
        f"{{ echo 'the {u} account cannot read {layout.config}: a parent of {layout.prefix} is not searchable'"
        f" >&2; exit 1; }}\n"
        f"$as_agent {q(layout.venv)}/bin/python -c '' || "
        f"{{ echo 'the {u} account cannot run {layout.venv}/bin/python (is its interpreter in a private "
        f"directory?)' >&2; exit 1; }}\n"
    )


def start_supervisor_command(layout: Layout, *, as_agent_user: bool = False) -> str:
    # Separate statements on purpose: `a && b & c` would background the whole `a && b` as a subshell holding
    # the SSH channel's output open, and the command would never return. setpriv execs (no fork), so $! is
    # the supervisor itself and the pid check still finds it.
    q = shlex.quote
    log_dir = layout.log.rsplit("/", 1)[0]
    drop = (
        f"setpriv --reuid={AGENT_USER} --regid={AGENT_USER} --init-groups --reset-env -- "
        if as_agent_user
        else ""
    )
    return (
        f"mkdir -p {q(layout.run)} {q(log_dir)} || exit 1\n"
        f"setsid nohup {drop}{q(layout.supervisor)} >> {q(layout.log)} 2>&1 < /dev/null &\n"
        f"echo $! > {q(layout.supervisor_pid)}\n"
    )


def _is_supervisor(layout: Layout) -> str:
    # The pid's argv must have the script as one whole argument: a shell whose command line merely mentions
    # the path (or a recycled pid) is not the supervisor.
    return f"tr '\\0' '\\n' < /proc/$pid/cmdline 2>/dev/null | grep -qxF {shlex.quote(layout.supervisor)}"


def supervisor_alive_command(layout: Layout) -> str:
    """Prints `alive PID` when the pid file names a running supervisor."""
    return (
        f'pid=$(cat {shlex.quote(layout.supervisor_pid)} 2>/dev/null) && [ -n "$pid" ] && '
        f"{_is_supervisor(layout)} && echo alive $pid; true"
    )


def stop_supervisor_command(layout: Layout) -> str:
    """Stops the supervisor (its TERM trap stops the agent first); prints `stopped` when one was running.

    Then whatever is left of its process group (it leads one: `setsid`) is killed: a supervisor that did not
    end within 15 s, an agent it could not stop. A removed node must not keep an agent running from deleted
    files. Engines run in process groups of their own and are not touched."""
    q = shlex.quote
    return (
        f"pid=$(cat {q(layout.supervisor_pid)} 2>/dev/null)\n"
        f'if [ -n "$pid" ] && {_is_supervisor(layout)}; then\n'
        f'  kill -TERM "$pid"; i=0\n'
        f"  while {_RUNNING} && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done\n"
        f'  kill -KILL -"$pid" 2>/dev/null\n'
        f"  echo stopped\n"
        f"fi\n"
        f"rm -f {q(layout.supervisor_pid)}\n"
    )
