"""Credentials carry only what their holder needs (issue 15, findings H1, M4, L4, L6 of the security review).

A real controller on loopback (in this process), real agent and router processes: a node's token opens the
agent hub for that node's name only and never the router stream with its engine keys; routers have their own
token; a torn-down node's token is refused; remote nodes default to the cluster CA; the webhook can be signed
and a flood of them is one poll; `/healthz` tells only liveness; node names are checked and forgotten."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import asyncssh
import openai
import pytest
from controller.helpers import Agents, Repo, cluster_yaml, model_yaml, settings_for, start
from faults.procs import RouterProc, start_router_following, start_router_proc
from llmgw_agent.protocol import PROTOCOL_VERSION, Inventory
from support import wait_for
from typer.testing import CliRunner

from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.ca import ClusterCA, IssuedCert
from llmgw.cli.main import app
from llmgw.controller.app import RunningController
from llmgw.controller.core import Controller
from llmgw.controller.loops.nodes import NodesLoop
from llmgw.controller.parts.hub import AgentHub, HubTimings, NodeLink

KEY = "sk-llmgw-" + "c" * 43

pytestmark = pytest.mark.integration


async def _hello(running: RunningController, node: str, token: str | None) -> dict[str, Any]:
    """Connect to the agent hub as `node` with `token`: the hub's first answer (welcome or refused)."""
    url = running.url.replace("http://", "ws://").replace("https://", "wss://") + "/agent/v1"
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    register = {
        "type": "register",
        "protocol_version": PROTOCOL_VERSION,
        "node": node,
        "agent_version": "test",
        "inventory": {},
        "shards": [],
    }
    async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=headers) as ws:
        await ws.send_str(json.dumps(register))
        msg = await ws.receive(timeout=10)
        return dict(json.loads(msg.data)) if msg.type == aiohttp.WSMsgType.TEXT else {"closed": True}


async def _router_stream_status(running: RunningController, token: str) -> int:
    """The HTTP status `/router/v1` answers the WebSocket upgrade with (101 when it opens)."""
    url = running.url.replace("http://", "ws://") + "/router/v1"
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as s:
        try:
            async with s.ws_connect(url, headers=headers) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


def _shared_token_cluster(tmp: Path, repo: Repo) -> None:
    """A Cluster declaring the shared `controller.token`, to show it is no router credential either."""
    text = cluster_yaml().replace("  controller:\n", "  controller:\n    token: {file: shared-token}\n")
    repo.write({"cluster.yaml": text, "shared-token": "shared-cluster-token\n"})


async def test_h1_node_token_cannot_open_router_stream(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    _shared_token_cluster(tmp_path, repo)
    running, _ = await start(settings_for(tmp_path, repo.path))
    try:
        await wait_for(lambda: running.controller.desired, 10, "the repo applied")
        token = running.controller.node_token("n1")
        assert (await _hello(running, "n1", token))["type"] == "welcome"  # it is n1's credential
        assert await _router_stream_status(running, token) == 401
        assert await _router_stream_status(running, "shared-cluster-token") == 401
        async with aiohttp.ClientSession() as s:
            for path, body in (("/api/v1/demand/x", None), ("/api/v1/usage-seen", {"models": []})):
                headers = {"Authorization": f"Bearer {token}"}
                async with s.post(running.url + path, json=body, headers=headers) as r:
                    assert r.status == 401, path
    finally:
        await running.stop()


async def test_h1_router_stream_needs_a_router_certificate_with_a_ca(tmp_path: Path) -> None:
    """With the cluster CA, `/router/v1` asks for a client certificate of the router role beside the token:
    a node's certificate (which every node holds) does not open it, nor does a router's open the hub."""
    ca = ClusterCA.open(tmp_path / "ca")
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    running, _ = await start(settings_for(tmp_path, repo.path, ca_dir=tmp_path / "ca"))
    url = running.url.replace("https://", "wss://") + "/router/v1"

    def ctx(issued: IssuedCert | None) -> ssl.SSLContext:
        c = ssl.create_default_context(cafile=str(ca.cert_path))
        if issued is not None:
            c.load_cert_chain(str(issued.cert_path), str(issued.key_path))
        return c

    async def status(issued: IssuedCert | None) -> int:
        headers = {"Authorization": f"Bearer {running.controller.router_token()}"}
        async with aiohttp.ClientSession() as s:
            try:
                async with s.ws_connect(url, headers=headers, ssl=ctx(issued)) as ws:
                    await ws.close()
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    try:
        await wait_for(lambda: running.controller.desired, 10, "the repo applied")
        router_cert = ca.router_cert("r1")
        assert await status(None) == 401
        assert await status(ca.node_cert("n1")) == 401
        assert await status(router_cert) == 101
        hub = running.url.replace("https://", "wss://") + "/agent/v1"
        register = {
            "type": "register",
            "protocol_version": PROTOCOL_VERSION,
            "node": "n1",
            "agent_version": "t",
            "inventory": {},
            "shards": [],
        }
        headers = {"Authorization": f"Bearer {running.controller.node_token('n1')}"}
        async with (
            aiohttp.ClientSession() as s,
            s.ws_connect(hub, headers=headers, ssl=ctx(router_cert)) as ws,
        ):
            await ws.send_str(json.dumps(register))
            answer = json.loads((await ws.receive(timeout=10)).data)
        assert answer["type"] == "refused" and "not a node" in answer["reason"], answer
    finally:
        await running.stop()


async def test_h1_router_process_follows_a_ca_controller_with_its_certificate(tmp_path: Path) -> None:
    """A real router process with `llmgw node router-cert`'s files and the router token opens the stream of
    a controller with the cluster CA (it shows connected); the same router with a node's certificate does not."""
    ca = ClusterCA.open(tmp_path / "ca")
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    running, _ = await start(settings_for(tmp_path, repo.path, ca_dir=tmp_path / "ca"))
    routers = []
    try:
        await wait_for(lambda: running.controller.desired, 10, "the repo applied")
        out = tmp_path / "router-tls"
        cli = ["node", "router-cert", "r1", "--out", str(out), "--ca-dir", str(tmp_path / "ca")]
        result = await asyncio.to_thread(CliRunner().invoke, app, cli)
        assert result.exit_code == 0, result.output
        token = tmp_path / "router-token"
        token.write_text(running.controller.router_token() + "\n")
        node = ca.node_cert("n1")
        for name, cert, key in (
            ("router", out / "router.crt", out / "router.key"),
            ("node", node.cert_path, node.key_path),
        ):
            keys = tmp_path / f"keys-{name}"
            keys.write_text(f"{'0' * 64} p1 key-1\n")
            args = [
                "--controller",
                running.url,
                "--token-file",
                str(token),
                "--keys-file",
                str(keys),
                "--controller-ca",
                str(out / "ca.crt"),
                "--controller-cert",
                str(cert),
                "--controller-key",
                str(key),
            ]
            routers.append(start_router_proc(tmp_path / f"router-{name}.log", args))
        with_router_cert, with_node_cert = routers

        def connected(r: RouterProc) -> bool:
            return "llmgw_router_controller_connected 1.0" in _metrics(r)

        await wait_for(lambda: connected(with_router_cert), 30, "the router connected with its certificate")
        # The controller refused the one with a node's certificate, with the words it logs.
        await wait_for(lambda: "401" in (tmp_path / "router-node.log").read_text(), 30, "the refusal")
        assert not connected(with_node_cert)
    finally:
        for r in routers:
            r.kill()
        await running.stop()


def _metrics(r: RouterProc) -> str:
    import urllib.request

    with urllib.request.urlopen(r.metrics + "/metrics", timeout=5) as answer:
        return str(answer.read().decode())


async def test_h1_node_token_registers_only_its_own_node(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    running, admin = await start(settings_for(tmp_path, repo.path))
    agents = Agents(tmp_path, tmp_path / "n1-token")
    try:
        c = running.controller
        n1 = c.node_token("n1")
        (tmp_path / "n1-token").write_text(n1 + "\n")
        agents.start("n1", running.url)  # a real agent with its own node's token
        await wait_for(lambda: _state(admin, "n1", "Ready"), 30, "n1 Ready with its own token")

        taken = await _hello(running, "n2", n1)
        assert taken["type"] == "refused" and "not node 'n2'" in taken["reason"], taken
        hijack = await _hello(running, "n1-other", n1)
        assert hijack["type"] == "refused"
        forged = await _hello(running, "n2", "llmgw-nt-" + "0" * 64)
        assert forged["type"] == "refused"
        names = {n["name"] for n in (await admin.get("/api/v1/nodes"))["nodes"]}
        assert names == {"n1"}
        assert (await admin.get("/api/v1/nodes"))["nodes"][0]["state"] == "Ready"  # not displaced
    finally:
        await running.stop()
        agents.cleanup()


async def _state(admin: Any, node: str, want: str) -> bool:
    return bool(await admin.node_state(node) == want)


async def test_h1_router_token_opens_router_stream(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/sim-a.yaml": model_yaml("sim-a", 1)})
    settings = settings_for(tmp_path, repo.path)
    running, admin = await start(settings)
    agents = Agents(tmp_path, tmp_path / "n1-token")
    router = None
    try:
        c = running.controller
        (tmp_path / "n1-token").write_text(c.node_token("n1") + "\n")
        agents.start("n1", running.url)
        fetched = await admin.get("/api/v1/credentials/router")
        assert fetched["token"] == c.router_token() and fetched["token"].startswith("llmgw-rt-")
        assert await _router_stream_status(running, fetched["token"]) == 101
        # A real router process holding only the router token (start_router_following reads tmp/token).
        router_dir = tmp_path / "router"
        router_dir.mkdir()
        (router_dir / "token").write_text(fetched["token"] + "\n")
        router = start_router_following(router_dir, [running.url], KEY)
        client = openai.AsyncOpenAI(base_url=router.api + "/v1", api_key=KEY, max_retries=0)

        async def answered() -> bool:
            try:
                await client.completions.create(model="sim-a", prompt="x", max_tokens=2)
            except openai.APIError:
                return False
            return True

        await wait_for(answered, 60, "the router serving sim-a from the stream it opened with its token")
        await client.close()
    finally:
        if router is not None:
            router.kill()
        await running.stop()
        agents.cleanup()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _remote_node(name: str, port: int, key: Path) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Node
metadata: {{name: {name}}}
spec:
  address: 127.0.0.1
  ssh: {{user: llmgw, port: {port}, identity: {{file: {key.name}}}, host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}}
"""


def _wheelhouse(path: Path) -> Path:
    path.mkdir()
    manifest = {
        "wheels": {},
        "agent_wheel": "llmgw_agent-0.1.0-py3-none-any.whl",
        "agent_version": "0.1.0",
        "source_digest": "x",
    }
    (path / "wheelhouse.json").write_text(json.dumps(manifest))
    return path


def _cluster_at(address: str) -> str:
    return (
        "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: t}\n"
        f'spec:\n  controller: {{address: "{address}", resync_interval: 1s}}\n'
    )


async def test_h1_torn_down_node_token_is_refused(tmp_path: Path) -> None:
    """The node is removed from the repo and torn down (its SSH is gone, as for a stolen machine): the token
    it kept no longer opens the hub, while its certificate-less link is closed."""
    repo = Repo(tmp_path / "repo", use_git=False)
    key = tmp_path / "secrets" / "key"  # settings_for's secrets directory: {file: key} names it
    key.parent.mkdir(exist_ok=True)
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    repo.write(
        {
            "cluster.yaml": _cluster_at("127.0.0.1:7070"),
            "nodes/gone.yaml": _remote_node("gone", _closed_port(), key),
        }
    )
    settings = settings_for(
        tmp_path,
        repo.path,
        wheelhouse=_wheelhouse(tmp_path / "wheels"),
        bootstrap_backoff_s=60.0,
        settle_s=0.0,
    )
    running, _ = await start(settings)
    try:
        await wait_for(lambda: running.controller.desired, 10, "the repo applied")
        kept = running.controller.node_token("gone")  # what bootstrap wrote to the machine
        assert (await _hello(running, "gone", kept))["type"] == "welcome"
        repo.write({"nodes/gone.yaml": None})

        async def torn_down() -> bool:
            op = running.controller.nodes.ops("gone")
            return op is not None and op.removal in ("done", "failed")

        await wait_for(torn_down, 60, "node gone torn down")
        assert "node token revoked" in running.controller.nodes.ops_for("gone").removal_message
        again = await _hello(running, "gone", kept)
        assert again["type"] == "refused" and "not node 'gone'" in again["reason"], again
        assert running.controller.node_token("gone") != kept  # a node declared again gets a new one
    finally:
        await running.stop()


async def test_m4_remote_node_defaults_to_mtls(tmp_path: Path) -> None:
    """A repo whose remote Nodes dial a non-loopback address: the controller makes its CA and serves TLS,
    and bootstrap gives the node a certificate and an agent config with tls and the CA."""
    repo = Repo(tmp_path / "repo", use_git=False)
    key = tmp_path / "secrets" / "key"  # settings_for's secrets directory: {file: key} names it
    key.parent.mkdir(exist_ok=True)
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    repo.write(
        {
            "cluster.yaml": _cluster_at("192.0.2.10:7070"),
            "nodes/far.yaml": _remote_node("far", _closed_port(), key),
        }
    )
    settings = settings_for(
        tmp_path, repo.path, wheelhouse=_wheelhouse(tmp_path / "wheels"), bootstrap_nodes=False
    )
    running, _ = await start(settings)
    try:
        assert running.url.startswith("https://")
        assert (settings.state_dir / "ca" / "ca.crt").is_file()
        c = running.controller
        await wait_for(lambda: c.desired, 10, "the repo applied")
        assert c.desired is not None
        loop = NodesLoop(c, _no_drain)
        opts = await loop._options(c.desired, "far", c.desired.catalog.nodes["far"])
        assert opts.ca is not None and opts.token == c.node_token("far")
        config = json.loads(
            render.agent_config(
                opts.layout,
                render.AgentSettings(
                    node="far",
                    controllers=opts.controllers,
                    tls=opts.ca is not None,
                    token=True,
                    advertise_host="192.0.2.20",
                ),
            )
        )
        assert config["tls"] and config["tls"]["ca"].endswith("ca.crt"), config
        await loop.close()
    finally:
        await running.stop()


async def test_m4_token_only_remote_node_needs_the_explicit_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    key = tmp_path / "secrets" / "key"  # settings_for's secrets directory: {file: key} names it
    key.parent.mkdir(exist_ok=True)
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    repo.write({"cluster.yaml": _cluster_at("192.0.2.10:7070")})  # no Node yet: no CA at start
    for insecure in (False, True):
        state = tmp_path / f"state-{insecure}"
        settings = settings_for(
            tmp_path,
            repo.path,
            state_dir=state,
            store=f"sqlite:///{tmp_path / f'c-{insecure}.db'}",
            wheelhouse=_wheelhouse(state.with_suffix(".wheels")),
            bootstrap_nodes=False,
            insecure_token_only_remote_nodes=insecure,
        )
        caplog.clear()
        running, _ = await start(settings)
        try:
            assert running.url.startswith("http://")
            warned = [r for r in caplog.records if "INSECURE: insecure_token_only_remote_nodes" in r.message]
            assert len(warned) == (1 if insecure else 0)  # said once, at start, when it is set
            repo.write({"nodes/far.yaml": _remote_node("far", _closed_port(), key)})
            c = running.controller
            await wait_for(functools.partial(_declares, c, "far"), 10, "far applied")
            assert c.desired is not None
            loop = NodesLoop(c, _no_drain)
            try:
                if insecure:
                    opts = await loop._options(c.desired, "far", c.desired.catalog.nodes["far"])
                    assert opts.ca is None and opts.token == c.node_token("far")
                else:
                    with pytest.raises(Exception, match="insecure_token_only_remote_nodes") as refused:
                        await loop._options(c.desired, "far", c.desired.catalog.nodes["far"])
                    assert "192.0.2.10:7070" in str(refused.value) and "in clear" in str(refused.value)
            finally:
                await loop.close()
        finally:
            await running.stop()
            repo.write({"nodes/far.yaml": None})


def _declares(c: Controller, node: str) -> bool:
    return c.desired is not None and node in c.desired.catalog.nodes


async def _no_drain(node: str, why: str) -> int:
    return 0


async def test_l4_webhook_needs_its_signature_when_a_secret_is_set(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    secret = tmp_path / "webhook-secret"
    secret.write_text("hook-secret\n")
    running, _ = await start(settings_for(tmp_path, repo.path, webhook_secret_file=secret))
    body = b'{"ref": "refs/heads/main"}'
    good = "sha256=" + hmac.new(b"hook-secret", body, hashlib.sha256).hexdigest()
    try:
        async with aiohttp.ClientSession() as s:
            for header, want in ((None, 401), ("sha256=" + "0" * 64, 401), (good, 202)):
                headers = {"X-Hub-Signature-256": header} if header else {}
                async with s.post(running.url + "/api/v1/webhook", data=body, headers=headers) as r:
                    assert r.status == want, (header, await r.text())
    finally:
        await running.stop()


async def _polls(running: RunningController) -> float:
    value = running.controller.metrics.source_polls._value.get()  # the counter the metrics page shows
    return float(value)


async def test_l4_webhook_flood_is_one_poll_per_interval(tmp_path: Path) -> None:
    """Two hundred webhooks within the interval start one poll, not two hundred (each would be a git fetch)."""
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    settings = settings_for(tmp_path, repo.path, dir_poll_s=3600.0, webhook_min_interval_s=5.0)
    running, _ = await start(settings)
    try:
        await wait_for(lambda: running.controller.desired, 10, "the first poll")
        assert await _polls(running) == 1
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                async with s.post(running.url + "/api/v1/webhook") as r:
                    assert r.status == 202
        await wait_for(lambda: _at_least(running, 2), 20, "the poll the flood asked for")
        async with aiohttp.ClientSession() as s, s.post(running.url + "/api/v1/webhook") as r:
            assert r.status == 202  # one more, after the coalesced poll: exactly one poll again
        await wait_for(lambda: _at_least(running, 3), 20, "the poll the last webhook asked for")
        assert await _polls(running) == 3
    finally:
        await running.stop()


async def _at_least(running: RunningController, n: int) -> bool:
    return await _polls(running) >= n


async def test_l4_healthz_tells_only_liveness(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    running, admin = await start(settings_for(tmp_path, repo.path))
    try:
        await wait_for(lambda: running.controller.desired, 10, "the repo applied")
        async with aiohttp.ClientSession() as s:
            async with s.get(running.url + "/healthz") as r:
                assert r.status == 200 and await r.json() == {"ok": True}
            async with s.get(running.url + "/healthz/leader") as r:
                assert r.status == 200 and await r.json() == {"ok": True}
        status = await admin.get("/api/v1/status")  # behind the token: the revision is there
        assert status["applied"]["revision"] == running.controller.desired.revision  # type: ignore[union-attr]
    finally:
        await running.stop()


async def test_l6_hub_refuses_bad_node_names(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    running, admin = await start(settings_for(tmp_path, repo.path))
    try:
        for bad in ("../etc", "Node-A", "a" * 64, "x\x1b[31m", "", "-a"):
            answer = await _hello(running, bad, "test-token")  # the admin token: any name, but a valid one
            assert answer["type"] == "refused" and "not a valid name" in answer["reason"], (bad, answer)
        assert (await admin.get("/api/v1/nodes"))["nodes"] == []
        assert (await _hello(running, "good-1", "test-token"))["type"] == "welcome"
    finally:
        await running.stop()


def test_l6_hub_forgets_undeclared_nodes_long_lost() -> None:
    now = [1000.0]
    hub = AgentHub(
        grant=lambda _: None,
        node_check=lambda _t, _n: None,
        timings=lambda: HubTimings(1.0, 5.0, 10.0),
        clock=lambda: now[0],
        on_change=lambda _: None,
        declared=lambda: {"kept"},
    )
    for name in ("kept", "made-up"):
        hub.nodes[name] = NodeLink(name, Inventory(), "t", "?", connected_at=now[0], last_seen=now[0])
    now[0] += 11.0
    assert dict(hub.expire()) == {"kept": "Lost", "made-up": "Lost"}
    assert set(hub.nodes) == {"kept", "made-up"}  # Lost, its replicas given up first
    now[0] += 10.0
    hub.expire()
    assert set(hub.nodes) == {"kept"}  # a declared node stays; the made-up name is forgotten


def test_l6_hub_refuses_new_names_past_its_bound() -> None:
    hub = AgentHub(
        grant=lambda _: None,
        node_check=lambda _t, _n: None,
        timings=lambda: HubTimings(1.0, 5.0, 10.0),
        clock=lambda: 0.0,
        on_change=lambda _: None,
        max_nodes=2,
    )
    from llmgw.controller.parts.credentials import Grant

    for name in ("a", "b"):
        hub.nodes[name] = NodeLink(name, Inventory(), "t", "?", connected_at=0.0, last_seen=0.0)
    assert hub._name_refusal("a", "t", Grant(any_node=True)) is None  # a known node reconnects
    refusal = hub._name_refusal("c", "t", Grant(any_node=True))
    assert refusal is not None and "limit" in refusal
