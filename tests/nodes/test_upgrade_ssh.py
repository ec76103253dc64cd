"""`llmgw upgrade` on a real fleet: a controller in this process, a node bootstrapped by it over a real OpenSSH
server on loopback, a second node whose agent is a local process (a node llmgw did not bootstrap), sim engines on
both, and a router process serving them through the whole upgrade.

One sshd target: the controller installs every bootstrapped node under one prefix (`node_prefix`), so two Nodes
behind the same sshd would share one install; the second agent is a local process instead, which is also the
case the upgrade must name rather than skip silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from controller.helpers import model_yaml
from faults.cluster import Cluster
from faults.procs import start_router_following
from fixtures.sshd import SshServer
from support import DEFAULT_AGENT_PORTS, wait_for, worker_cache

from llmgw.adapters.ssh import render, wheels
from llmgw.adapters.ssh.wheels import Wheelhouse

from .agent_procs import stop_agent

pytestmark = [pytest.mark.ssh, pytest.mark.integration, pytest.mark.timeout(900), DEFAULT_AGENT_PORTS]

KEY = "sk-llmgw-" + "u" * 43
NEXT_VERSION = "0.1.1"
SSH_NODE, LOCAL_NODE = "ssh-1", "zz-local"  # name order: the SSH node is upgraded first


def _variant(
    tmp_path_factory: pytest.TempPathFactory, version: str, edits: dict[str, tuple[str, str]]
) -> Wheelhouse:
    """The agent's source with its version set and `edits` (path: (old, new)) made, built as a wheelhouse
    (cached across sessions, as the base one is)."""
    source = wheels.find_agent_source()
    assert source is not None
    copy = tmp_path_factory.mktemp("agent-" + version) / "agent"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    edits = {
        "pyproject.toml": ('version = "0.1.0"', f'version = "{version}"'),
        "llmgw_agent/__init__.py": ('__version__ = "0.1.0"', f'__version__ = "{version}"'),
        **edits,
    }
    for name, (old, new) in edits.items():
        text = (copy / name).read_text()
        assert old in text, f"{name} no longer says {old!r}: update this test"
        (copy / name).write_text(text.replace(old, new))
    return wheels.build(worker_cache(f"test-wheelhouse-{version}"), copy)


@pytest.fixture(scope="session")
def next_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    return _variant(tmp_path_factory, NEXT_VERSION, {})


@pytest.fixture(scope="session")
def crashing_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    """An agent that installs cleanly and exits at once when run: it never comes back."""
    crash = (
        "        daemon.run_from_args(ns)",
        '        raise SystemExit("llmgw-agent: broken on purpose by the test")',
    )
    return _variant(tmp_path_factory, "0.1.2", {"llmgw_agent/main.py": crash})


def _corrupt_copy(house: Wheelhouse, where: Path) -> Path:
    """`house` with an agent wheel that is not a wheel, its manifest rewritten to match: it loads, and pip on
    the node refuses it."""
    shutil.copytree(house.directory, where)
    (where / house.agent_wheel).write_bytes(b"not a zip archive\n" * 64)
    manifest = json.loads((where / wheels.MANIFEST).read_text())
    manifest["wheels"][house.agent_wheel] = wheels.sha256_file(where / house.agent_wheel)
    (where / wheels.MANIFEST).write_text(json.dumps(manifest))
    return where


def _repo_files(cluster: Cluster, sshd: SshServer) -> dict[str, str]:
    cluster_doc = f"""\
apiVersion: llmgw/v1
kind: Cluster
metadata: {{name: upgrade-test}}
spec:
  controller:
    address: "{cluster.address}"
    heartbeat_interval: 200ms
    unreachable_after: 15s
    lost_after: 5m
    resync_interval: 1s
"""
    node_doc = f"""\
apiVersion: llmgw/v1
kind: Node
metadata: {{name: {SSH_NODE}}}
spec:
  address: 127.0.0.1
  ssh: {{user: {sshd.user}, port: {sshd.port}, identity: {{file: ssh-key}}, host_key: "{sshd.host_key_line}"}}
"""
    return {"cluster.yaml": cluster_doc, f"nodes/{SSH_NODE}.yaml": node_doc}


def _venv_in_use(layout: render.Layout) -> str | None:
    """The venv `venv` links to, or None while it is still bootstrap's own directory."""
    return os.path.realpath(layout.venv) if os.path.islink(layout.venv) else None


def _kill_engines(state_dirs: list[Path]) -> None:
    """Test hygiene: engines outlive agents by design, so kill every engine group the agents recorded."""
    for record in (r for d in state_dirs for r in d.glob("shards/*.json")):
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
            os.killpg(int(json.loads(record.read_text())["pgid"]), signal.SIGKILL)


@pytest.fixture
async def fleet(
    tmp_path: Path, sshd_server: SshServer, wheelhouse: Wheelhouse, node_root: Path
) -> AsyncIterator[Cluster]:
    layout = render.Layout(prefix=str(node_root / "opt-llmgw"))
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    shutil.copy(sshd_server.client_key, secrets / "ssh-key")
    (secrets / "ssh-key").chmod(0o600)
    cluster = Cluster(
        tmp_path, node_prefix=layout.prefix, wheelhouse=wheelhouse.directory, node_register_timeout_s=90.0
    )
    try:
        cluster.repo.write(_repo_files(cluster, sshd_server), "cluster and the ssh node")
        admin = await cluster.start_controller()
        # One core: one replica fits on the local node, so the other has to run on the SSH node.
        cluster.agents.start(LOCAL_NODE, cluster.address, cpu_cores=1)

        async def both_ready() -> bool:
            return all([await admin.node_state(n) == "Ready" for n in (SSH_NODE, LOCAL_NODE)])

        await wait_for(both_ready, 180, "the SSH node bootstrapped and the local agent Ready")
        cluster.repo.write({"models/a.yaml": model_yaml("sim-a", min_=2)}, "models")
        yield cluster
    finally:
        try:
            await asyncio.to_thread(stop_agent, layout)  # the controller in this loop serves on meanwhile
        finally:
            await cluster.close()
            cluster.agents.cleanup()
            _kill_engines([Path(layout.state), *(tmp_path / "agents").glob("*/state")])


async def _nodes(cluster: Cluster) -> dict[str, dict[str, Any]]:
    assert cluster.admin is not None
    return {n["name"]: n for n in (await cluster.admin.get("/api/v1/nodes"))["nodes"]}


def _pids(replicas: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    return {r["id"]: (r["nodes"][0], r["pid"]) for r in replicas}


class Traffic:
    """Requests one after another through the router until stopped; every outcome is counted."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        self.ok = 0
        self.failures: list[str] = []
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            i += 1
            try:
                r = await self.client.chat.completions.create(
                    model="sim-a", messages=[{"role": "user", "content": f"upgrade {i}"}], max_tokens=4
                )
                self.ok += 1 if r.choices and r.choices[0].message.content else 0
            except openai.APIError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")


async def _serving(cluster: Cluster) -> tuple[Any, openai.AsyncOpenAI]:
    router = start_router_following(cluster.tmp, [cluster.address], KEY)
    client = openai.AsyncOpenAI(base_url=router.api + "/v1", api_key=KEY, max_retries=0, timeout=30)

    async def routed() -> bool:
        try:
            await client.chat.completions.create(
                model="sim-a", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            return True
        except openai.APIError:
            return False

    await wait_for(routed, 60, "the router serving sim-a")
    return router, client


async def test_upgrade_rolls_the_ssh_node_while_every_engine_keeps_serving(
    fleet: Cluster, next_wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    admin = fleet.admin
    assert admin is not None
    before = _pids(await fleet.wait_ready("sim-a", 2))
    assert {node for node, _ in before.values()} == {SSH_NODE, LOCAL_NODE}, before
    nodes = await _nodes(fleet)
    assert nodes[SSH_NODE]["agent_version"] == nodes[LOCAL_NODE]["agent_version"] == "0.1.0"
    router, client = await _serving(fleet)
    traffic = Traffic(client)
    try:
        sending = asyncio.create_task(traffic.run())
        await wait_for(lambda: traffic.ok >= 5, 30, "requests flowing before the upgrade")
        answer = await admin.post(
            "/api/v1/upgrade", {"wheelhouse": str(next_wheelhouse.directory)}, expect=200
        )
        sent_during = traffic.ok
        await wait_for(lambda: traffic.ok >= sent_during + 5, 30, "requests flowing after the upgrade")
        traffic.stopping.set()
        await sending
    finally:
        router.stop()
    by_node = {n["node"]: n for n in answer["nodes"]}
    assert answer["ok"] is True, answer
    assert by_node[SSH_NODE]["status"] == "upgraded", by_node[SSH_NODE]
    assert (by_node[SSH_NODE]["version_before"], by_node[SSH_NODE]["version_after"]) == (
        "0.1.0",
        NEXT_VERSION,
    )
    assert [s["step"] for s in by_node[SSH_NODE]["steps"]] == [
        "connect",
        "check",
        "wheels",
        "verify",
        "install",
        "switch",
        "restart",
        "back",
    ]
    assert by_node[LOCAL_NODE]["status"] == "not_managed"
    assert "upgrade it yourself" in by_node[LOCAL_NODE]["message"]
    assert traffic.failures == [], traffic.failures[:5]
    assert _pids(await fleet.wait_ready("sim-a", 2)) == before, "the same engines, adopted, never restarted"
    nodes = await _nodes(fleet)
    assert (nodes[SSH_NODE]["agent_version"], nodes[LOCAL_NODE]["agent_version"]) == (NEXT_VERSION, "0.1.0")
    layout = render.Layout(prefix=fleet.settings.node_prefix)
    assert _venv_in_use(layout) == layout.venv_for(next_wheelhouse.digest)

    async def audited() -> bool:
        entries = (await admin.get("/api/v1/audit"))["entries"]
        return any(e["action"] == "fleet.upgrade" and e["outcome"] == "accepted" for e in entries)

    await wait_for(audited, 30, "the upgrade in the audit log")

    # Again: the node already runs that wheelhouse, and nothing is restarted.
    again = await admin.post("/api/v1/upgrade", {"wheelhouse": str(next_wheelhouse.directory)}, expect=200)
    assert {n["node"]: n["status"] for n in again["nodes"]} == {
        SSH_NODE: "unchanged",
        LOCAL_NODE: "not_managed",
    }

    # A wheelhouse whose files no longer match its manifest is refused before any node is touched.
    tampered = _corrupt_copy(next_wheelhouse, tmp_path / "tampered")
    (tampered / next_wheelhouse.agent_wheel).write_bytes(b"changed after the manifest was written")
    refused = await admin.post("/api/v1/upgrade", {"wheelhouse": str(tampered)}, expect=400)
    assert "no longer match" in refused["error"]["message"]


async def test_an_upgrade_whose_agent_wheel_is_corrupt_stops_at_the_first_node_on_its_old_version(
    fleet: Cluster, next_wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    admin = fleet.admin
    assert admin is not None
    before = _pids(await fleet.wait_ready("sim-a", 2))
    router, client = await _serving(fleet)
    traffic = Traffic(client)
    broken = _corrupt_copy(next_wheelhouse, tmp_path / "broken")
    try:
        sending = asyncio.create_task(traffic.run())
        await wait_for(lambda: traffic.ok >= 5, 30, "requests flowing before the upgrade")
        answer = await admin.post("/api/v1/upgrade", {"wheelhouse": str(broken), "parallel": 2}, expect=200)
        traffic.stopping.set()
        await sending
    finally:
        router.stop()
    by_node = {n["node"]: n for n in answer["nodes"]}
    assert answer["ok"] is False
    failed = by_node[SSH_NODE]
    assert failed["status"] == "failed"
    assert failed["message"].startswith("install: installing llmgw-agent 0.1.1 on ssh-1 failed"), failed
    assert "the running agent is untouched" in failed["message"]
    steps = {s["step"]: s["status"] for s in failed["steps"]}
    assert (steps["verify"], steps["install"], steps["switch"], steps["restart"]) == (
        "unchanged",
        "failed",
        "skipped",
        "skipped",
    )
    assert by_node[LOCAL_NODE]["status"] == "not_managed"
    assert traffic.failures == [], traffic.failures[:5]
    assert _pids(await fleet.wait_ready("sim-a", 2)) == before
    nodes = await _nodes(fleet)
    assert nodes[SSH_NODE]["agent_version"] == "0.1.0" and nodes[SSH_NODE]["state"] == "Ready"
    layout = render.Layout(prefix=fleet.settings.node_prefix)
    assert _venv_in_use(layout) is None, "bootstrap's venv is still the one in use"
    half_made = layout.venv_for(wheels.load(broken).digest)
    assert not await asyncio.to_thread(os.path.exists, half_made), "the half-made venv is removed"
    events = [e["kind"] for e in await fleet.events()]
    assert "node_upgrade_failed" in events


async def test_an_agent_that_does_not_come_back_is_switched_back_to_the_old_one(
    fleet: Cluster, crashing_wheelhouse: Wheelhouse
) -> None:
    admin = fleet.admin
    assert admin is not None
    before = _pids(await fleet.wait_ready("sim-a", 2))
    router, client = await _serving(fleet)
    traffic = Traffic(client)
    try:
        sending = asyncio.create_task(traffic.run())
        await wait_for(lambda: traffic.ok >= 5, 30, "requests flowing before the upgrade")
        body = {"wheelhouse": str(crashing_wheelhouse.directory), "timeout_s": 8}
        answer = await admin.post("/api/v1/upgrade", body, expect=200)
        traffic.stopping.set()
        await sending
    finally:
        router.stop()
    failed = {n["node"]: n for n in answer["nodes"]}[SSH_NODE]
    assert failed["status"] == "failed", failed
    steps = {s["step"]: (s["status"], s["detail"]) for s in failed["steps"]}
    assert steps["switch"][0] == steps["restart"][0] == "changed"
    assert steps["back"][0] == "failed" and "did not come back within 8s" in steps["back"][1], steps["back"]
    assert steps["rollback"][0] == "changed", steps["rollback"]
    assert traffic.failures == [], traffic.failures[:5]
    assert _pids(await fleet.wait_ready("sim-a", 2)) == before, "the engines kept running through it all"
    nodes = await _nodes(fleet)
    assert nodes[SSH_NODE]["agent_version"] == "0.1.0" and nodes[SSH_NODE]["state"] == "Ready"
    # Bootstrap's venv, moved beside the new one on the switch, is the one in use again.
    layout = render.Layout(prefix=fleet.settings.node_prefix)
    in_use = _venv_in_use(layout)
    assert in_use is not None and in_use != layout.venv_for(crashing_wheelhouse.digest)
