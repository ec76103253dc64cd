"""The controller's node loop without an SSH server: the pure decisions, and a real controller reporting a node
it cannot reach (connection refused) per node, in the admin API, events and the metric, retried after a
backoff, and left alone on a standby."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from pathlib import Path

import asyncssh
from support import wait_for
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.controller.loops.nodes import (
    LinkSeen,
    NodesLoop,
    needs_bootstrap,
    removal_step,
    retry_delay,
    to_bootstrap,
)
from llmgw.controller.parts.state import NodeOps

from .helpers import Repo, settings_for, start


def test_only_nodes_without_a_live_agent_are_bootstrapped() -> None:
    links = {
        "up": LinkSeen(connected=True, state="Ready"),
        "blip": LinkSeen(connected=False, state="Ready"),  # just dropped: its heartbeat window first
        "silent": LinkSeen(connected=False, state="Unreachable"),
    }
    assert not needs_bootstrap(links["up"])
    assert not needs_bootstrap(links["blip"])
    assert needs_bootstrap(links["silent"]) and needs_bootstrap(None)
    ops = {"waiting": NodeOps("waiting", state="failed", retry_at=50.0)}
    declared = ["up", "blip", "silent", "new", "busy", "waiting", "settling"]
    chosen = to_bootstrap(declared, links, ops, now=10.0, busy={"busy"}, settling={"settling"})
    assert chosen == ["new", "silent"]
    # After its backoff the failed node is tried again.
    assert "waiting" in to_bootstrap(declared, links, ops, now=50.0, busy=(), settling=())


def test_removal_replaces_then_drains_then_tears_down() -> None:
    op = NodeOps("gone")
    t = {"drain_timeout": 60.0, "replace_wait": 600.0}
    assert removal_step(op, 2, now=0.0, **t) == "drain"
    op.removal, op.drain_started = "draining", 0.0
    assert removal_step(op, 2, now=10.0, **t) == "wait"  # the reconciler replaces them, then stops them
    assert removal_step(op, 0, now=10.0, **t) == "teardown"
    assert removal_step(op, 1, now=600.0, **t) == "force"  # a replacement that never gets ready
    op.forced = True
    assert removal_step(op, 1, now=610.0, **t) == "wait"
    assert removal_step(op, 1, now=660.0, **t) == "teardown"  # a stuck drain does not block
    op.removal = "removing"
    assert removal_step(op, 0, now=700.0, **t) == "wait"


def test_retry_delay_grows_is_jittered_and_capped() -> None:
    rng = random.Random(7)
    first = [retry_delay(1, 10.0, rng) for _ in range(50)]
    assert all(8.0 <= d <= 12.0 for d in first) and len(set(first)) > 1
    assert all(16.0 <= retry_delay(2, 10.0, rng) <= 24.0 for _ in range(20))
    assert all(retry_delay(30, 10.0, rng) <= 300.0 for _ in range(20))


async def _no_drain(node: str, reason: str) -> int:
    return 0


CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: t}
spec:
  controller: {address: "127.0.0.1:7070", token: {file: agent-token}, resync_interval: 1s}
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _node(name: str, port: int, key: Path) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Node
metadata: {{name: {name}, labels: {{zone: a}}}}
spec:
  address: 127.0.0.1
  ssh: {{user: llmgw, port: {port}, identity: {{file: {key.name}}}, host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}}
"""


def _fake_wheelhouse(path: Path) -> Path:
    # Never reached: the node fails at connect. Loading it is what the controller does first.
    path.mkdir()
    manifest = {
        "wheels": {},
        "agent_wheel": "llmgw_agent-0.1.0-py3-none-any.whl",
        "agent_version": "0.1.0",
        "source_digest": "x",
    }
    (path / "wheelhouse.json").write_text(json.dumps(manifest))
    return path


async def test_unreachable_node_is_reported_per_node_and_retried_after_a_backoff(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "agent-token").write_text("agent-token-for-test\n")
    key = tmp_path / "secrets" / "key"
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    port = _closed_port()
    repo.write(
        {
            "cluster.yaml": CLUSTER,
            "nodes/gone.yaml": _node("gone", port, key),
            "nodes/here.yaml": "apiVersion: llmgw/v1\nkind: Node\nmetadata: {name: here}\nspec: {local: true}\n",
        }
    )
    settings = settings_for(
        tmp_path,
        repo.path,
        wheelhouse=_fake_wheelhouse(tmp_path / "wheels"),
        bootstrap_backoff_s=60.0,
        settle_s=0.0,
    )
    running, admin = await start(settings)
    try:

        async def failed() -> dict[str, object] | None:
            nodes = {n["name"]: n for n in (await admin.get("/api/v1/nodes"))["nodes"]}
            node = nodes.get("gone")
            boot = node["bootstrap"] if node else None
            return node if boot and boot["state"] == "failed" else None

        node = await wait_for(failed, 30, "node gone reported failed")
        assert node["state"] == "NotJoined" and node["declared"] is True
        boot = node["bootstrap"]
        assert boot["message"] == f"ssh: connection refused at 127.0.0.1:{port}"
        assert boot["step"] == "connect" and boot["attempts"] == 1
        assert 0 < boot["retry_in_s"] <= 72.0  # waiting for its backoff, not trying again at once
        names = [n["name"] for n in (await admin.get("/api/v1/nodes"))["nodes"]]
        assert "here" not in names  # a local node is not bootstrapped over SSH

        events = [e for e in running.controller.events.items if e["object"] == "gone"]
        assert [e["kind"] for e in events] == ["node_bootstrap", "node_bootstrap_failed"]
        assert "connection refused" in events[-1]["message"] and "next attempt in" in events[-1]["message"]
        metrics = await admin.metrics()
        assert 'llmgw_controller_node_bootstrap{node="gone",state="failed"} 1.0' in metrics

        # `llmgw nodes` says it too (the CLI blocks: it runs in a thread while this loop serves it).
        cli = ["nodes", "--controller", running.url, "--token-file", str(settings.admin_token_file)]
        result = await asyncio.to_thread(CliRunner().invoke, app, cli, env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        line = next(x for x in result.output.splitlines() if x.strip("│ ").startswith("gone"))
        assert "NotJoined" in line and "failed: ssh: connection refused at 127.0.0.1" in line

        # A standby does nothing: past its backoff, the node is not tried again.
        c = running.controller
        c.leading = lambda: False  # type: ignore[method-assign]
        c.nodes.ops_for("gone").retry_at = c.clock()
        loop = NodesLoop(c, _no_drain)
        await loop.pass_once()
        assert loop.tasks == {} and c.nodes.ops_for("gone").attempts == 1
        c.leading = lambda: True  # type: ignore[method-assign]
        c.nodes.ops_for("gone").upgrading = True
        await loop.pass_once()
        assert loop.tasks == {}  # `llmgw upgrade` is restarting its agent: no bootstrap races it
        c.nodes.ops_for("gone").upgrading = False
        await loop.pass_once()
        assert set(loop.tasks) == {"gone"}  # the leader does
        task = loop.tasks["gone"]
        c.leading = lambda: False  # type: ignore[method-assign]
        await loop.pass_once()  # stepped down: its attempt ends, left to the new leader
        await wait_for(task.done, 5, "the attempt cancelled")
        assert task.cancelled() and c.nodes.ops_for("gone").state == "pending"
        assert "llmgw_controller_node_bootstrap{" not in await admin.metrics()
        await loop.close()
    finally:
        await running.stop()
