"""Bootstrap over a real OpenSSH server on loopback into a temporary prefix.

The agent installs from the local wheelhouse with no index, starts as a supervised background process (no
systemd here), and registers over mutual TLS with a hub that checks its certificate. A second run changes
nothing; a wrong key, a closed port and a wrong host key are reported with their reasons and do not stop the
good node; teardown stops and removes the agent, keeps the weights and revokes the certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from fixtures.sshd import SshServer, keygen
from support import DEFAULT_AGENT_PORTS, free_port, wait_for

from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.bootstrap import (
    BootstrapOptions,
    NodeResult,
    TeardownOptions,
    bootstrap_many,
    bootstrap_node,
    teardown_node,
)
from llmgw.adapters.ssh.ca import ClusterCA, PeerRejected
from llmgw.adapters.ssh.remote import SshTarget
from llmgw.adapters.ssh.wheels import Wheelhouse

from .agent_hub import HubStub
from .agent_procs import stop_agent

pytestmark = [pytest.mark.ssh, pytest.mark.integration, pytest.mark.timeout(900), DEFAULT_AGENT_PORTS]

STEPS = [
    "connect",
    "check",
    "wheels",
    "venv",
    "agent",
    "credentials",
    "config",
    "account",
    "service",
    "register",
]


def _modes(layout: render.Layout) -> dict[str, int]:
    paths = {"key": layout.tls_key, "cert": layout.tls_cert, "ca": layout.tls_ca, "config": layout.config}
    return {name: stat.S_IMODE(Path(p).stat().st_mode) for name, p in paths.items()}


def _uid(pid: int) -> int:
    """The real uid of `pid`, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def _owner(path: str) -> int:
    return os.stat(path).st_uid


def _children(parent: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                stat_line = (proc / "stat").read_text()
                if int(stat_line[stat_line.rfind(")") + 2 :].split()[1]) == parent:
                    found.append(int(proc.name))
    return found


def _read(path: str) -> str:
    return Path(path).read_text().strip()


def _exists(*paths: str) -> list[bool]:
    return [Path(p).exists() for p in paths]


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[HubStub]:
    hub = HubStub(ClusterCA.open(tmp_path / "controller" / "ca"))
    await hub.start()
    yield hub
    await hub.stop()


def _statuses(result: NodeResult) -> dict[str, str]:
    return {s.name: s.status for s in result.steps}


async def test_bootstrap_registers_over_mtls_then_changes_nothing_and_tears_down(
    sshd_server: SshServer, wheelhouse: Wheelhouse, hub: HubStub, tmp_path: Path, node_root: Path
) -> None:
    layout = render.Layout(prefix=str(node_root / "opt-llmgw"))
    opts = BootstrapOptions(
        controllers=(f"127.0.0.1:{hub.port}",),
        wheelhouse=wheelhouse,
        registered=hub.registered,
        ca=hub.ca,
        layout=layout,
        register_timeout=90,
        labels={"node-a": {"zone": "test"}},
    )
    good = SshTarget(
        "node-a",
        sshd_server.host,
        sshd_server.port,
        sshd_server.user,
        identity_file=sshd_server.client_key,
        host_key=sshd_server.host_key_line,
    )
    keygen(tmp_path / "stranger")
    wrong_key = SshTarget(
        "node-b",
        sshd_server.host,
        sshd_server.port,
        sshd_server.user,
        identity_file=tmp_path / "stranger",
        known_hosts=sshd_server.known_hosts,
    )
    closed = free_port()
    refused = SshTarget(
        "node-c",
        "127.0.0.1",
        closed,
        "llmgw",
        identity_file=sshd_server.client_key,
        host_key=sshd_server.host_key_line,
    )
    other_host = SshTarget(
        "node-d",
        sshd_server.host,
        sshd_server.port,
        sshd_server.user,
        identity_file=sshd_server.client_key,
        host_key=(tmp_path / "stranger.pub").read_text().strip(),
    )
    try:
        first = await bootstrap_many([good, wrong_key, refused, other_host], opts)

        assert first["node-a"].ok, first["node-a"].steps
        assert [s.name for s in first["node-a"].steps] == STEPS
        assert _statuses(first["node-a"])["agent"] == "changed"
        assert _statuses(first["node-a"])["register"] == "changed"
        assert "background process" in next(s.detail for s in first["node-a"].steps if s.name == "service")
        assert await hub.registered("node-a", float("-inf"))
        # Logged in as root, yet the supervisor and the agent run as the unprivileged llmgw account (M6).
        agent_uid = pwd.getpwnam(render.AGENT_USER).pw_uid
        supervisor = int(_read(layout.supervisor_pid))
        agent = await wait_for(
            lambda: _children(supervisor), limit_s=30, what="the agent under its supervisor"
        )
        assert agent_uid != 0
        assert {_uid(pid) for pid in [supervisor, *agent]} == {agent_uid}
        assert _owner(layout.state) == agent_uid and _owner(layout.venv) == 0

        assert first["node-b"].failure == f"ssh: permission denied for root@127.0.0.1:{sshd_server.port}"
        assert first["node-c"].failure == f"ssh: connection refused at 127.0.0.1:{closed}"
        failure_d = first["node-d"].failure or ""
        assert failure_d.startswith("host key mismatch for 127.0.0.1: expected SHA256:")
        assert ", got SHA256:" in failure_d
        for name in ("node-b", "node-c", "node-d"):
            assert _statuses(first[name])["check"] == "skipped"

        # Credentials and config are private to root on the node.
        assert _modes(layout) == dict.fromkeys(["key", "cert", "ca", "config"], 0o600)
        # Installed with no index: the venv holds exactly the wheelhouse's agent.
        assert _read(layout.installed_marker) == wheelhouse.digest

        second = await bootstrap_node(good, opts)
        assert _statuses(second) == dict.fromkeys(STEPS, "unchanged"), second.steps

        issued = hub.ca.node_cert("node-a")
        down = await teardown_node(good, TeardownOptions(layout=layout, ca=hub.ca))
        assert {s.name: s.status for s in down.steps} == {
            "connect": "unchanged",
            "stop": "changed",
            "remove": "changed",
            "weights": "unchanged",
            "revoke": "changed",
        }, down.steps
        assert _exists(layout.venv, layout.etc, layout.supervisor_pid) == [False, False, False]
        der = x509.load_pem_x509_certificate(issued.cert_pem).public_bytes(Encoding.DER)
        with pytest.raises(PeerRejected, match="revoked"):
            hub.ca.check_peer(der)
        again = await teardown_node(good, TeardownOptions(layout=layout, ca=hub.ca))
        assert all(s.status == "unchanged" for s in again.steps), again.steps
    finally:
        # Never leave an agent running, even when an assertion failed first; in a thread: the loop serves on.
        await asyncio.to_thread(stop_agent, layout)


CLUSTER_YAML = """apiVersion: llmgw/v1
kind: Cluster
metadata: {name: ssh-test}
spec:
  controller: {address: "127.0.0.1:7070"}
"""


async def test_bootstrapped_agent_registers_with_the_real_controller_over_mtls(
    sshd_server: SshServer, wheelhouse: Wheelhouse, tmp_path: Path, node_root: Path
) -> None:
    from llmgw.controller.app import start_controller
    from llmgw.controller.parts.settings import ControllerOptions

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "cluster.yaml").write_text(CLUSTER_YAML)
    ca = ClusterCA.open(tmp_path / "ca")
    (tmp_path / "admin-token").write_text("admin-token-for-test\n")
    settings = ControllerOptions(
        repo=str(repo),
        store=f"sqlite:///{tmp_path / 'controller.db'}",
        listen="127.0.0.1:0",
        metrics_listen=None,
        admin_token_file=tmp_path / "admin-token",
        state_dir=tmp_path / "controller-state",
        ca_dir=tmp_path / "ca",
        dir_poll_s=0.2,
    )
    running = await start_controller(settings)
    layout = render.Layout(prefix=str(node_root / "opt-llmgw"))
    hub = running.controller.hub

    async def registered(node: str, since: float) -> bool:
        link = hub.nodes.get(node)
        return link is not None and link.connected and link.connected_at >= since

    target = SshTarget(
        "ssh-real",
        sshd_server.host,
        sshd_server.port,
        sshd_server.user,
        identity_file=sshd_server.client_key,
        known_hosts=sshd_server.known_hosts,
    )
    try:
        assert running.url.startswith("https://")
        opts = BootstrapOptions(
            controllers=(running.url.removeprefix("https://"),),
            wheelhouse=wheelhouse,
            registered=registered,
            ca=ca,
            token=running.admin_token,  # this hub asks agents for a bearer token beside the certificate
            layout=layout,
            register_timeout=90,
        )
        result = await bootstrap_node(target, opts)
        assert result.ok, result.steps
        assert _statuses(result)["register"] == "changed"
        link = hub.nodes["ssh-real"]
        assert link.inventory.cpu_cores is not None  # the agent's own Register, not a stand-in
        down = await teardown_node(target, TeardownOptions(layout=layout, ca=ca))
        assert _statuses(down)["revoke"] == "changed"
    finally:
        # Never leave an agent running, even when an assertion failed first; in a thread: the loop serves on.
        await asyncio.to_thread(stop_agent, layout)
        await running.stop()
