"""The controller bootstraps the repo's Nodes by itself, over a real OpenSSH server on loopback.

A repo declares two remote Nodes on the fixture's sshd (host key pinned): `good` logs in with the fixture's
key, `bad` with a key the server does not know. The controller (mutual TLS from its cluster CA, the Cluster's
token beside it) installs the agent into a temporary prefix; it registers and shows Ready while `bad` is
reported failed with its reason. Removing `good` from the repo tears it down: the agent is stopped, its files
removed (weights kept), its certificate revoked and its link gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from controller.helpers import Admin, Repo, model_yaml, settings_for, start
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from fixtures.sshd import SshServer, keygen
from support import DEFAULT_AGENT_PORTS, free_port, wait_for

from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.ca import ClusterCA, PeerRejected
from llmgw.adapters.ssh.wheels import Wheelhouse
from llmgw.controller.app import RunningController

pytestmark = [pytest.mark.ssh, pytest.mark.integration, pytest.mark.timeout(600), DEFAULT_AGENT_PORTS]


def _cluster(port: int) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Cluster
metadata: {{name: ssh-controller}}
spec:
  controller:
    address: "127.0.0.1:{port}"
    token: {{file: agent-token}}
    heartbeat_interval: 500ms
    resync_interval: 1s
"""


def _node(name: str, ssh: SshServer, key: Path) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Node
metadata: {{name: {name}, labels: {{zone: test}}}}
spec:
  address: {ssh.host}
  ssh:
    user: {ssh.user}
    port: {ssh.port}
    identity: {{file: {key.name}}}
    host_key: "{ssh.host_key_line}"
"""


def _agent_processes(prefix: str) -> list[int]:
    """Processes running from the install prefix (the supervisor and the agent)."""
    found: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if prefix.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


def _stop_leftover(layout: render.Layout) -> None:
    """Test hygiene: never leave an agent running, even when an assertion failed before teardown.

    SIGKILL, not SIGTERM: the supervise loop restarts an agent that exits, and a shell waiting on its child
    does not act on SIGTERM until the child ends (a failed CI run left both behind)."""
    for pid in _agent_processes(layout.prefix):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _write(path: str, data: bytes) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _read(f"/proc/{pid}/stat").split(b") ")[-1].startswith(b"Z")


def _exists(path: str) -> bool:
    return Path(path).exists()


class TlsAdmin(Admin):
    """The admin API over the controller's TLS listener, trusting the cluster CA."""

    def __init__(self, running: RunningController, ca: ClusterCA) -> None:
        super().__init__(running)
        self.ssl = ssl.create_default_context(cafile=str(ca.cert_path))

    async def get(self, path: str) -> Any:
        async with (
            aiohttp.ClientSession() as s,
            s.get(self.url + path, headers=self.headers, ssl=self.ssl) as r,
        ):
            assert r.status == 200, f"GET {path}: {r.status} {await r.text()}"
            return await r.json()


async def _node_json(admin: Admin, name: str) -> dict[str, Any] | None:
    nodes = (await admin.get("/api/v1/nodes"))["nodes"]
    return next((n for n in nodes if n["name"] == name), None)


async def test_controller_bootstraps_reports_failures_and_tears_down_removed_nodes(
    sshd_server: SshServer, wheelhouse: Wheelhouse, tmp_path: Path, node_root: Path
) -> None:
    port = free_port()
    secrets = tmp_path / "secrets"  # the controller's secrets_dir (settings_for): the repo names files in it
    secrets.mkdir()
    (secrets / "agent-token").write_text("agent-token-for-test\n")
    keygen(secrets / "stranger")
    shutil.copy(sshd_server.client_key, secrets / "client")
    (secrets / "client").chmod(0o600)
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write(
        {
            "cluster.yaml": _cluster(port),
            "nodes/good.yaml": _node("good", sshd_server, secrets / "client"),
            "nodes/bad.yaml": _node("bad", sshd_server, secrets / "stranger"),
            "models/echo.yaml": model_yaml("echo", min_=1),
        }
    )
    ca_dir = tmp_path / "ca"
    ca = ClusterCA.open(ca_dir)
    layout = render.Layout(prefix=str(node_root / "opt-llmgw"))
    settings = settings_for(
        tmp_path,
        repo.path,
        listen=f"127.0.0.1:{port}",
        ca_dir=ca_dir,
        wheelhouse=wheelhouse.directory,
        node_prefix=layout.prefix,
        node_service="process",
        node_register_timeout_s=90.0,
        bootstrap_backoff_s=60.0,
        settle_s=0.0,
    )
    running, _ = await start(settings)
    admin = TlsAdmin(running, ca)
    hub = running.controller.hub
    try:
        assert running.url.startswith("https://")

        async def ready() -> dict[str, Any] | None:
            node = await _node_json(admin, "good")
            return (
                node if node and node["state"] == "Ready" and node["bootstrap"]["state"] == "done" else None
            )

        good = await wait_for(ready, 240, "node good Ready after its bootstrap")
        assert good["declared"] and good["labels"]["zone"] == "test"
        assert good["inventory"]["cpu_cores"] is not None  # the agent's own Register
        assert good["bootstrap"]["attempts"] == 1
        assert good["bootstrap"]["message"].startswith("joined: changed ")

        async def bad_failed() -> dict[str, Any] | None:
            node = await _node_json(admin, "bad")
            return node if node and node["bootstrap"]["state"] == "failed" else None

        bad = await wait_for(bad_failed, 60, "node bad reported failed")
        assert bad["state"] == "NotJoined"
        assert bad["bootstrap"]["message"] == (
            f"ssh: permission denied for {sshd_server.user}@127.0.0.1:{sshd_server.port}"
        )
        assert bad["bootstrap"]["retry_in_s"] > 0
        metrics = await admin.metrics()
        assert 'llmgw_controller_node_bootstrap{node="good",state="done"} 1.0' in metrics
        assert 'llmgw_controller_node_bootstrap{node="bad",state="failed"} 1.0' in metrics

        # The agent proved itself with a certificate from the cluster CA (mutual TLS).
        der = x509.load_pem_x509_certificate(_read(layout.tls_cert)).public_bytes(Encoding.DER)
        assert ca.check_peer(der).node == "good"
        first_link = hub.nodes["good"]
        assert first_link.connected
        assert _agent_processes(layout.prefix)

        # The model's replica runs on the node that joined; removal must drain it first.
        replica = await wait_for(
            lambda: admin.replicas("echo", "ready"), 120, "a ready replica of echo on good"
        )
        assert replica[0]["node"] == "good"
        engine_pid = replica[0]["pid"]

        # Weights survive removal.
        _write(f"{layout.weights}/model.gguf", b"weights")

        repo.write({"nodes/good.yaml": None})

        async def removed() -> dict[str, Any] | None:
            node = await _node_json(admin, "good")
            removal = node.get("removal") if node else None
            return node if removal and removal["state"] in ("done", "failed") else None

        gone = await wait_for(removed, 120, "node good torn down")
        assert gone["removal"]["state"] == "done", gone["removal"]
        assert "certificate revoked" in gone["removal"]["message"]
        assert gone["state"] == "Removed" and "good" not in hub.nodes
        await wait_for(lambda: not _agent_processes(layout.prefix), 30, "the agent's processes to end")
        assert not _exists(layout.venv) and not _exists(layout.etc)
        assert _read(f"{layout.weights}/model.gguf") == b"weights"
        with pytest.raises(PeerRejected, match="revoked"):
            ca.check_peer(der)
        kinds = [(e["kind"], e["object"]) for e in running.controller.events.items]
        for kind in ("node_joined", "node_removing", "node_removed"):
            assert (kind, "good") in kinds
        stops = [e for e in running.controller.events.items if e["kind"] == "replica_stop"]
        assert [e["object"] for e in stops] == [replica[0]["id"]]
        # The only node is gone, so its replica has no replacement and is drained and stopped at once; the
        # message says why (make-before-break found nowhere to place one).
        stopped = stops[0]["message"]
        assert "removed from the repo" in stopped and "cannot be placed" in stopped
        assert stopped.endswith("(draining first)")
        assert kinds.index(("replica_stop", replica[0]["id"])) < kinds.index(("node_removed", "good"))
        assert not _alive(engine_pid)  # stopped through its agent, not orphaned by the teardown
        assert ("node_bootstrap_failed", "bad") in kinds
    finally:
        _stop_leftover(layout)
        await running.stop()
