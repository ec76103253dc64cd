"""Bootstrap a node over SSH: check it, install the agent from the controller's wheels, configure, start, wait.

Every step looks before it acts (file hashes and modes, the wheel set installed, the unit's content, the
process alive), so a second run writes nothing and reports each step `unchanged`. A step that fails stops that
node only; `bootstrap_many` runs nodes concurrently and one failure never stops another.

The controller calls `bootstrap_many` (or `bootstrap_node`) with targets built by `remote.target_for`, a
`BootstrapOptions`, and a `registered(node, since)` predicate answering from its agent hub.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.ca import ClusterCA
from llmgw.adapters.ssh.remote import Remote, RemoteFile, SshTarget, StepFailed, connect
from llmgw.adapters.ssh.wheels import Wheelhouse, compatibility_problem

Status = Literal["changed", "unchanged", "failed", "skipped"]
MIN_PYTHON = (3, 11)

# node name, and the controller's monotonic time the agent was (re)started (-inf: not restarted this run).
# True once that node has a live link registered at or after that time.
Registered = Callable[[str, float], Awaitable[bool]]
OnStep = Callable[[str, "Step"], None]
StepFn = Callable[[Remote], Awaitable[tuple[Status, str]]]  # one step on one node: its status and the words
On = TypeVar(
    "On"
)  # what the steps act on: a node over SSH (Remote), or the machine `llmgw server init` runs on


@dataclass(frozen=True)
class Step:
    name: str
    status: Status
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.status}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class NodeResult:
    node: str
    steps: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.status != "failed" for s in self.steps)

    @property
    def failure(self) -> str | None:
        return next((s.detail for s in self.steps if s.status == "failed"), None)

    @property
    def changed(self) -> bool:
        return any(s.status == "changed" for s in self.steps)


@dataclass(frozen=True)
class BootstrapOptions:
    controllers: tuple[str, ...]  # host:port agents dial
    wheelhouse: Wheelhouse
    registered: Registered | None  # None: do not wait (the step reports skipped)
    ca: ClusterCA | None = None  # mutual TLS when set
    token: str | None = None  # bearer token: alone (development) or beside TLS when the hub asks for both
    layout: render.Layout = field(default_factory=render.Layout)
    service: Literal["auto", "systemd", "process"] = "auto"
    register_timeout: float = 120.0
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # per node
    engines: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    metrics_listen: Mapping[str, str] = field(default_factory=dict)  # per node: its node-health listener
    on_step: OnStep | None = None


@dataclass(frozen=True)
class Machine:
    python: str
    python_version: tuple[int, int, int]
    arch: str
    memory_bytes: int | None
    nvidia_smi: str | None
    systemd: bool
    root: bool

    def describe(self) -> str:
        mem = f"{self.memory_bytes / 2**30:.1f} GiB" if self.memory_bytes else "memory unknown"
        gpu = f"nvidia-smi at {self.nvidia_smi}" if self.nvidia_smi else "no nvidia-smi"
        init = "systemd" if self.systemd else "no systemd"
        v = ".".join(map(str, self.python_version))
        return f"python {v} at {self.python}, {self.arch}, {mem}, {gpu}, {init}"


_PRIVATE_CHECK = (
    "import os, sys\n"
    "d = os.path.realpath(sys.executable)\n"
    "while d != '/':\n"
    "    d = os.path.dirname(d)\n"
    "    if not os.stat(d).st_mode & 1: sys.exit(0)\n"
    "sys.exit(1)\n"
)
_PROBE = (
    "PRIVATE_CHECK="
    + shlex.quote(_PRIVATE_CHECK)
    + r"""
echo "arch=$(uname -m)"
echo "mem_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo 2>/dev/null)"
echo "uid=$(id -u)"
command -v nvidia-smi >/dev/null 2>&1 && echo "nvidia_smi=$(command -v nvidia-smi)"
if [ -d /run/systemd/system ]; then echo "systemd=$(systemctl is-system-running 2>/dev/null)"; fi
for p in python3 python3.13 python3.12 python3.11 /usr/bin/python3; do
  path=$(command -v "$p" 2>/dev/null) || continue
  v=$("$path" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) || continue
  echo "python=$v $path"
  # Whether another account may run it (every directory up to the real interpreter searchable by others).
  "$path" -c "$PRIVATE_CHECK" 2>/dev/null && echo "python_private=$path"
done
true
"""
)


def parse_probe(output: str, wanted: tuple[int, int] | None) -> Machine:
    """The machine from the probe's output. Prefers the Python the wheels were built for."""
    values: dict[str, str] = {}
    pythons: list[tuple[tuple[int, int, int], str]] = []
    private: set[str] = set()
    for line in output.splitlines():
        key, _, value = line.partition("=")
        if key == "python_private":
            private.add(value)
        elif key == "python":
            version, _, path = value.partition(" ")
            parts = tuple(int(x) for x in version.split("."))
            if len(parts) == 3:
                pythons.append(((parts[0], parts[1], parts[2]), path))
        elif key:
            values[key] = value.strip()
    usable = [p for p in pythons if p[0][:2] >= MIN_PYTHON]
    if not usable:
        found = ", ".join(f"{'.'.join(map(str, v))} at {p}" for v, p in pythons) or "no python3 on PATH"
        raise StepFailed(f"python3 3.11+ not found ({found}); install python3.11 or newer")
    if values.get("uid") == "0":
        # Logged in as root, the agent runs as the llmgw account: a python under root's home is not for it.
        public = [p for p in usable if p[1] not in private]
        if not public:
            found = ", ".join(p for _, p in usable)
            raise StepFailed(
                f"python3 3.11+ is only in directories the {render.AGENT_USER} account may not enter ({found}); "
                "install python3 and python3-venv system-wide"
            )
        usable = public
    matching = [p for p in usable if wanted is not None and p[0][:2] == wanted]
    chosen_version, chosen_path = (matching or usable)[0]
    mem_kb = values.get("mem_kb", "")
    systemd_state = values.get("systemd")
    return Machine(
        python=chosen_path,
        python_version=chosen_version,
        arch=values.get("arch", "unknown"),
        memory_bytes=int(mem_kb) * 1024 if mem_kb.isdigit() else None,
        nvidia_smi=values.get("nvidia_smi") or None,
        # "offline" is a systemd that is installed but not running as init (containers).
        systemd=systemd_state is not None and systemd_state not in ("offline", "unknown", ""),
        root=values.get("uid") == "0",
    )


def pip_install_command(venv: str, layout: render.Layout, house: Wheelhouse) -> str:
    """Install the wheelhouse's agent into `venv` from the node's wheel directory, never from an index."""
    # --force-reinstall: a rebuilt agent keeps its version number, and pip would otherwise skip it.
    return (
        f"{shlex.quote(venv)}/bin/python -m pip install --quiet --disable-pip-version-check "
        f"--no-index --find-links {shlex.quote(layout.wheels)} --force-reinstall "
        f"{shlex.quote(house.agent_wheel.split('-')[0] + '==' + house.agent_version)}"
    )


def _wheel_python(house: Wheelhouse) -> tuple[int, int] | None:
    for name in house.wheels:
        for tag in name.split("-")[-3].split("."):
            if tag.startswith("cp3") and tag[3:].isdigit():
                return (3, int(tag[3:]))
    return None


class _Run:
    """One node's bootstrap: the steps in order, each recorded as it ends."""

    def __init__(self, target: SshTarget, opts: BootstrapOptions) -> None:
        self.target = target
        self.opts = opts
        self.layout = opts.layout
        self.result = NodeResult(target.node)
        self.restart = False  # something the running agent reads changed
        self._machine: Machine | None = None
        self.started_at = float("-inf")

    @property
    def machine(self) -> Machine:
        if self._machine is None:
            raise StepFailed("internal: the machine was not checked before this step")
        return self._machine

    def record(self, name: str, status: Status, detail: str = "") -> None:
        step = Step(name, status, detail)
        self.result.steps.append(step)
        if self.opts.on_step is not None:
            self.opts.on_step(self.target.node, step)

    def steps(self) -> list[tuple[str, StepFn]]:
        return [
            ("check", self.check),
            ("wheels", self.wheels),
            ("venv", self.venv),
            ("agent", self.agent),
            ("credentials", self.credentials),
            ("config", self.config),
            ("account", self.account),
            ("service", self.service),
            ("register", self.register),
        ]

    async def run(self) -> NodeResult:
        return await run_on_node(self.target, self.result, self.record, self.steps, self._steps)

    async def _steps(self, remote: Remote) -> None:
        await run_steps(remote, self.steps(), self.record)

    # ---------------------------------------------------------------------------------------------- steps

    async def check(self, remote: Remote) -> tuple[Status, str]:
        self._machine = parse_probe(await remote.run(_PROBE), _wheel_python(self.opts.wheelhouse))
        problem = compatibility_problem(
            self.opts.wheelhouse, self.machine.python_version[:2], self.machine.arch
        )
        if problem:
            raise StepFailed(problem)
        if self.service_mode() == "systemd" and not self.machine.root:
            raise StepFailed(
                f"systemd runs on {self.target.node} but {self.target.user} is not root; "
                "log in as root or choose the process service mode"
            )
        q = shlex.quote(self.layout.prefix)
        code, out = await remote.status(f"mkdir -p {q} && test -w {q}")
        if code != 0:
            raise StepFailed(
                f"cannot write {self.layout.prefix} as {self.target.user} on {self.target.node}: "
                f"{out.strip() or 'not writable'}; create it owned by {self.target.user}"
            )
        return "unchanged", self.machine.describe()

    def service_mode(self) -> Literal["systemd", "process"]:
        if self.opts.service != "auto":
            return self.opts.service
        return "systemd" if self.machine.systemd else "process"

    async def wheels(self, remote: Remote) -> tuple[Status, str]:
        house = self.opts.wheelhouse
        d = self.layout.wheels
        listing = await remote.run(f"mkdir -p {shlex.quote(d)} && cd {shlex.quote(d)} && ls -1")
        present = {n for n in listing.split() if n.endswith(".whl")}
        states = await remote.file_states([f"{d}/{n}" for n in sorted(present & set(house.wheels))])
        missing = [n for n, sha in sorted(house.wheels.items()) if states.get(f"{d}/{n}", ("", 0))[0] != sha]
        await remote.put_many(
            [RemoteFile(f"{d}/{n}", (house.directory / n).read_bytes(), 0o644) for n in missing]
        )
        sent = len(missing)
        stale = sorted(present - set(house.wheels))
        if stale:
            await remote.run("cd " + shlex.quote(d) + " && rm -f " + " ".join(shlex.quote(n) for n in stale))
        if sent or stale:
            return "changed", f"copied {sent} of {len(house.wheels)} wheels, removed {len(stale)} stale"
        return "unchanged", f"{len(house.wheels)} wheels present"

    async def venv(self, remote: Remote) -> tuple[Status, str]:
        v = shlex.quote(self.layout.venv)
        want = ".".join(map(str, self.machine.python_version))
        code, out = await remote.status(
            f"{v}/bin/python -c 'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])'"
        )
        if code == 0 and out.strip() == want:
            return "unchanged", f"{self.layout.venv} (python {want})"
        code, out = await remote.status(f"rm -rf {v} && {shlex.quote(self.machine.python)} -m venv {v}")
        if code != 0:
            hint = "; install python3-venv" if "ensurepip" in out else ""
            raise StepFailed(f"`python3 -m venv` failed on {self.target.node}: {out.strip()[-300:]}{hint}")
        self.restart = True
        return "changed", f"created {self.layout.venv} with python {want}"

    async def agent(self, remote: Remote) -> tuple[Status, str]:
        house = self.opts.wheelhouse
        marker = shlex.quote(self.layout.installed_marker)
        code, out = await remote.status(f"cat {marker}")
        installed = out.strip() if code == 0 else ""
        code, _ = await remote.status(f"test -x {shlex.quote(self.layout.agent_bin)}")
        if installed == house.digest and code == 0:
            return "unchanged", f"llmgw-agent {house.agent_version}"
        code, out = await remote.status(pip_install_command(self.layout.venv, self.layout, house))
        if code != 0:
            raise StepFailed(f"installing the agent on {self.target.node} failed: {out.strip()[-500:]}")
        await remote.put(RemoteFile(self.layout.installed_marker, house.digest.encode() + b"\n", 0o644))
        self.restart = True
        return "changed", f"installed llmgw-agent {house.agent_version}"

    async def credentials(self, remote: Remote) -> tuple[Status, str]:
        lay = self.layout
        files: list[RemoteFile] = []
        what: list[str] = []
        if self.opts.ca is not None:
            issued = self.opts.ca.node_cert(self.target.node)
            files += [
                RemoteFile(lay.tls_cert, issued.cert_pem, 0o600),
                RemoteFile(lay.tls_key, issued.key_pem, 0o600),
                RemoteFile(lay.tls_ca, self.opts.ca.cert_pem, 0o600),
            ]
            what.append(f"client certificate CN={self.target.node}, serial {issued.serial:x}")
        if self.opts.token:
            files.append(RemoteFile(lay.token, self.opts.token.encode() + b"\n", 0o600))
            what.append("agent token")
        if not files:
            raise StepFailed("the controller has neither a cluster CA nor an agent token to give the node")
        await remote.run(f"mkdir -p {shlex.quote(lay.etc)} && chmod 700 {shlex.quote(lay.etc)}")
        written = await remote.sync_files(files)
        if written:
            self.restart = True
            return "changed", "wrote " + " and ".join(what)
        return "unchanged", " and ".join(what)

    async def config(self, remote: Remote) -> tuple[Status, str]:
        settings = render.AgentSettings(
            node=self.target.node,
            controllers=self.opts.controllers,
            tls=self.opts.ca is not None,
            token=bool(self.opts.token),
            advertise_host=self.target.serving_address or self.target.host,
            bind_host="0.0.0.0" if self.target.serving_listen_all else None,
            labels=self.opts.labels.get(self.target.node, {}),
            engines=self.opts.engines,
            metrics_listen=self.opts.metrics_listen.get(self.target.node),
        )
        files = [RemoteFile(self.layout.config, render.agent_config(self.layout, settings), 0o600)]
        if self.service_mode() == "systemd":
            files.append(
                RemoteFile(
                    self.layout.unit_path,
                    render.systemd_unit(
                        self.layout, self.target.node, gpus=self.machine.nvidia_smi is not None
                    ),
                    0o644,
                )
            )
        else:
            files.append(RemoteFile(self.layout.supervisor, render.supervisor_script(self.layout), 0o755))
        written = await remote.sync_files(files)
        if written:
            self.restart = True
            if self.layout.unit_path in written:
                await remote.run("systemctl daemon-reload")
            return "changed", "wrote " + ", ".join(written)
        return "unchanged", self.layout.config

    async def account(self, remote: Remote) -> tuple[Status, str]:
        """Logged in as root: the agent and its engines still run as the unprivileged `llmgw` account."""
        if not self.machine.root:
            return "unchanged", f"the agent runs as {self.target.user}, the account bootstrap logs in as"
        code, out = await remote.status(render.account_command(self.layout))
        if code != 0:
            raise StepFailed(
                f"preparing the {render.AGENT_USER} account on {self.target.node}: {out.strip()[-400:]}"
            )
        done = set(out.split())
        if done & {"created", "owned"}:
            self.restart = True
            what = ["created the account"] if "created" in done else []
            what += ["gave it the state, weights and config"] if "owned" in done else []
            return "changed", f"{render.AGENT_USER}: " + ", ".join(what)
        return "unchanged", f"runs as {render.AGENT_USER}"

    async def service(self, remote: Remote) -> tuple[Status, str]:
        if self.service_mode() == "systemd":
            return await self._systemd(remote)
        alive = (await remote.run(render.supervisor_alive_command(self.layout))).split()
        if alive and not self.restart:
            return "unchanged", f"supervisor running (pid {alive[1]})"
        if alive:
            await remote.run(render.stop_supervisor_command(self.layout))
        self.started_at = time.monotonic()
        await remote.run(render.start_supervisor_command(self.layout, as_agent_user=self.machine.root))
        alive = (await remote.run(render.supervisor_alive_command(self.layout))).split()
        if not alive:
            raise StepFailed(
                f"the agent supervisor did not start on {self.target.node}; see {self.layout.log}"
            )
        verb = "restarted" if self.restart else "started"
        return "changed", f"{verb} as a background process (pid {alive[1]}, log {self.layout.log})"

    async def _systemd(self, remote: Remote) -> tuple[Status, str]:
        unit = shlex.quote(self.layout.unit_name)
        _, enabled = await remote.status(f"systemctl is-enabled {unit}")
        _, active = await remote.status(f"systemctl is-active {unit}")
        if enabled.strip() == "enabled" and active.strip() == "active" and not self.restart:
            return "unchanged", f"{self.layout.unit_name} active"
        self.started_at = time.monotonic()
        await remote.run(f"systemctl enable {unit} && systemctl restart {unit}")
        return "changed", f"{self.layout.unit_name} enabled and (re)started"

    async def register(self, remote: Remote) -> tuple[Status, str]:
        node, since, registered = self.target.node, self.started_at, self.opts.registered
        if registered is None:
            return "skipped", "not waited for"
        if since == float("-inf") and await registered(node, since):
            return "unchanged", "registered with the controller"
        deadline = time.monotonic() + self.opts.register_timeout
        while time.monotonic() < deadline:
            if await registered(node, since):
                return "changed", "registered with the controller"
            await asyncio.sleep(0.25)
        _, tail = await remote.status(f"tail -n 5 {shlex.quote(self.layout.log)}")
        where = f"; its log ends: {tail.strip()[-400:]}" if self.service_mode() == "process" else ""
        raise StepFailed(
            f"the agent on {node} did not register within {self.opts.register_timeout:g}s "
            f"(it dials {', '.join(self.opts.controllers)}){where}"
        )


async def run_steps(
    remote: On,
    steps: Sequence[tuple[str, Callable[[On], Awaitable[tuple[Status, str]]]]],
    record: Callable[[str, Status, str], None],
    skip: Callable[[str], str | None] = lambda name: None,
) -> bool:
    """Run the steps in order, recording each; the first that fails ends the run, recorded failed. `skip(name)`
    gives a reason to record a step unchanged without running it. False when a step failed: how bootstrap and
    upgrade both walk a node, and `llmgw server init` the machine it runs on."""
    for name, step in steps:
        reason = skip(name)
        if reason is not None:
            record(name, "unchanged", reason)
            continue
        try:
            status, detail = await step(remote)
        except (
            Exception
        ) as exc:  # StepFailed, a bug or a dropped connection: this node fails, the others go on
            record(
                name, "failed", str(exc) if isinstance(exc, StepFailed) else f"{type(exc).__name__}: {exc}"
            )
            return False
        record(name, status, detail)
    return True


async def run_on_node(
    target: SshTarget,
    result: NodeResult,
    record: Callable[[str, Status, str], None],
    steps: Callable[[], list[tuple[str, StepFn]]],
    body: Callable[[Remote], Awaitable[None]],
) -> NodeResult:
    """Connect to the node, run `body` over the connection, and mark every step it did not reach skipped:
    how bootstrap and upgrade both account for a node, step by step."""
    try:
        conn = await connect(target)
    except StepFailed as exc:
        record("connect", "failed", str(exc))
    else:
        record("connect", "unchanged", target.where)
        try:
            await body(Remote(conn, target))
        finally:
            conn.close()
    done = {s.name for s in result.steps}
    for name, _ in steps():
        if name not in done:
            record(name, "skipped", "an earlier step failed")
    return result


async def bootstrap_node(target: SshTarget, opts: BootstrapOptions) -> NodeResult:
    return await _Run(target, opts).run()


async def bootstrap_many(targets: Sequence[SshTarget], opts: BootstrapOptions) -> dict[str, NodeResult]:
    """Bootstrap nodes concurrently; each result says how far that node got and why it stopped."""
    results = await asyncio.gather(*(bootstrap_node(t, opts) for t in targets))
    return {r.node: r for r in results}


# ---------------------------------------------------------------------------------------------------- teardown


@dataclass(frozen=True)
class TeardownOptions:
    layout: render.Layout = field(default_factory=render.Layout)
    ca: ClusterCA | None = None
    remove_weights: bool = False
    on_step: OnStep | None = None


async def teardown_node(target: SshTarget, opts: TeardownOptions) -> NodeResult:
    """Stop and remove the agent of a node removed from the repo (the caller drained its replicas first).

    The certificate is revoked even when the node cannot be reached: a machine gone for good must not be able
    to come back with the credentials it had."""
    result = NodeResult(target.node)

    def record(name: str, status: Status, detail: str = "") -> None:
        step = Step(name, status, detail)
        result.steps.append(step)
        if opts.on_step is not None:
            opts.on_step(target.node, step)

    try:
        conn = await connect(target)
    except StepFailed as exc:
        record("connect", "failed", str(exc))
        conn = None
    if conn is not None:
        record("connect", "unchanged", target.where)
        try:
            await _remove(Remote(conn, target), opts, record)
        except (StepFailed, OSError) as exc:
            record("remove", "failed", str(exc))
        finally:
            conn.close()
    if opts.ca is not None:
        revoked = opts.ca.revoke(target.node)
        if revoked:
            record("revoke", "changed", "revoked serial " + ", ".join(f"{s:x}" for s in revoked))
        else:
            record("revoke", "unchanged", "no certificate kept for this node")
    return result


async def _remove(remote: Remote, opts: TeardownOptions, record: Callable[[str, Status, str], None]) -> None:
    lay = opts.layout
    unit = shlex.quote(lay.unit_name)
    stopped: list[str] = []
    _, out = await remote.status(f"test -f {shlex.quote(lay.unit_path)} && echo present")
    if out.strip() == "present":
        await remote.status(f"systemctl disable --now {unit}")
        await remote.run(f"rm -f {shlex.quote(lay.unit_path)} && systemctl daemon-reload")
        stopped.append(f"unit {lay.unit_name} removed")
    out = await remote.run(render.stop_supervisor_command(lay))
    if "stopped" in out:
        stopped.append("supervisor stopped")
    record("stop", "changed" if stopped else "unchanged", ", ".join(stopped) or "no agent running")
    paths = lay.removable() + (lay.kept() if opts.remove_weights else [])
    present = [p for p in (await remote.run(render.remove_command(paths))).split("\0") if p]
    if present:
        record("remove", "changed", "removed " + ", ".join(present))
    else:
        record("remove", "unchanged", "nothing left to remove")
    kept = "removed as asked" if opts.remove_weights else "kept " + ", ".join(lay.kept())
    record(
        "weights",
        "changed" if opts.remove_weights and any(p in present for p in lay.kept()) else "unchanged",
        kept,
    )
