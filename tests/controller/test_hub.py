"""The agent hub and the router stream against scripted WebSocket peers (no agent process): refusals,
commands with replies, shard updates feeding the live state, and the snapshot routers receive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from llmgw_agent.protocol import (
    PROTOCOL_VERSION,
    Command,
    Gpu,
    Heartbeat,
    Inventory,
    Register,
    Reply,
    ShardState,
    ShardStatus,
    dump,
    parse_controller_message,
)
from support import wait_for

from llmgw.controller.status import fleet as views
from llmgw.core.placement.rooms import build_rooms
from llmgw.core.security import engine_key

from .helpers import Admin, Repo, cluster_yaml, model_yaml, settings_for, start


@pytest.fixture
async def ctl(tmp_path: Path) -> AsyncIterator[Admin]:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write(
        {"cluster.yaml": cluster_yaml(unreachable="1s", lost="2s"), "a.yaml": model_yaml("sim-a", min_=1)}
    )
    running, admin = await start(settings_for(tmp_path, repo.path))
    await wait_for(lambda: running.controller.desired is not None, 10, "a revision applied")
    try:
        yield admin
    finally:
        await running.stop()


class FakeAgent:
    """Speaks the agent side of the protocol by hand; answers commands and reports shards as told."""

    def __init__(self, admin: Admin, node: str, token: str | None = None) -> None:
        self.url = admin.url.replace("http://", "ws://") + "/agent/v1"
        self.node = node
        self.token = token if token is not None else admin.running.admin_token
        self.commands: list[Command] = []
        self.shards: dict[str, ShardStatus] = {}
        self.refuse_start = ""
        self.start_state: ShardState = "ready"  # what a started shard reports first

    async def connect(
        self,
        shards: list[ShardStatus] | None = None,
        version: int = PROTOCOL_VERSION,
        gpus: list[Gpu] | None = None,
    ) -> Any:
        self.session = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.ws = await self.session.ws_connect(self.url, headers=headers)
        register = Register(
            node=self.node,
            agent_version="test",
            protocol_version=version,
            inventory=Inventory(cpu_cores=4, memory_bytes=8 * 1024**3, gpus=gpus or []),
            shards=shards or [],
        )
        await self.ws.send_str(dump(register))
        msg = await self.ws.receive(timeout=10)
        return parse_controller_message(msg.data)

    async def serve(self) -> None:
        """Answer start_shard by reporting the shard ready; heartbeat every 0.2s."""

        async def beat() -> None:
            while True:
                await self.ws.send_str(dump(Heartbeat(shards=list(self.shards.values()))))
                await asyncio.sleep(0.2)

        beats = asyncio.create_task(beat())
        try:
            async for msg in self.ws:
                cmd = parse_controller_message(msg.data)
                assert isinstance(cmd, Command)
                self.commands.append(cmd)
                if cmd.action == "start_shard" and self.refuse_start:
                    await self.ws.send_str(dump(Reply(id=cmd.id, ok=False, error=self.refuse_start)))
                    continue
                if cmd.action == "start_shard" and cmd.spec is not None:
                    spec = cmd.spec
                    self.shards[spec.shard_id] = ShardStatus(
                        replica_id=spec.replica_id,
                        model=spec.model,
                        engine=spec.engine,
                        state=self.start_state,
                        pid=4242,
                        base_url="http://127.0.0.1:9",
                        fingerprint=spec.fingerprint,
                    )
                elif cmd.action == "stop_shard":
                    self.shards.pop(f"{cmd.replica_id}-{cmd.shard_rank or 0}", None)
                await self.ws.send_str(dump(Reply(id=cmd.id, ok=True)))
        finally:
            beats.cancel()

    async def close(self) -> None:
        await self.ws.close()
        await self.session.close()


async def test_agents_without_the_token_or_with_another_protocol_are_refused(ctl: Admin) -> None:
    for token, version, words in (
        ("", PROTOCOL_VERSION, "missing Authorization"),
        ("wrong", PROTOCOL_VERSION, "wrong token"),
        (None, PROTOCOL_VERSION + 1, "protocol version"),
    ):
        agent = FakeAgent(ctl, "n1", token=token)
        reply = await agent.connect(version=version)
        assert reply.type == "refused" and words in reply.reason
        await agent.close()
    assert (await ctl.get("/api/v1/nodes"))["nodes"] == []


async def test_register_start_ready_published_then_unreachable_and_lost(ctl: Admin) -> None:
    agent = FakeAgent(ctl, "n1")
    welcome = await agent.connect()
    assert welcome.type == "welcome" and welcome.heartbeat_interval_s == pytest.approx(0.2)
    serving = asyncio.create_task(agent.serve())
    try:
        replicas = await wait_for(lambda: ctl.replicas("sim-a", "ready"), 10, "the replica ready")
        rid = replicas[0]["id"]
        start = next(c for c in agent.commands if c.action == "start_shard")
        assert start.spec is not None and start.spec.model == "sim-a" and start.spec.cpu_cores == 1
        secret = (ctl.running.controller.cluster_secret()).encode()
        assert start.spec.api_key == engine_key(secret, rid)

        snap = await _snapshot(ctl)
        assert [e["replica_id"] for e in snap["endpoints"]] == [rid]
        assert snap["endpoints"][0]["api_key"] == engine_key(secret, rid)
        assert "sim-a" in snap["models"]
        state = await ctl.get("/api/v1/state")
        assert [r["id"] for r in state["replicas"]] == [rid]
        assert "api_key" not in json.dumps(state)  # plan's snapshot carries no secrets
    finally:
        serving.cancel()
        await agent.close()
    await wait_for(lambda: _node(ctl, "n1", "Unreachable"), 10, "n1 Unreachable")
    await wait_for(lambda: _node(ctl, "n1", "Lost"), 10, "n1 Lost")
    await wait_for(lambda: _none(ctl), 10, "the replica on the lost node forgotten")


async def test_shards_reported_at_register_are_adopted_not_started(ctl: Admin) -> None:
    running = ShardStatus(
        replica_id="sim-a-sim-old",
        model="sim-a",
        engine="sim",
        state="ready",
        pid=777,
        base_url="http://127.0.0.1:9",
    )
    agent = FakeAgent(ctl, "n1")
    agent.shards[running.shard_id] = running
    await agent.connect(shards=[running])
    serving = asyncio.create_task(agent.serve())
    try:
        items = await wait_for(lambda: ctl.replicas("sim-a", "ready"), 10, "the adopted replica")
        assert [(r["id"], r["adopted"], r["pid"]) for r in items] == [("sim-a-sim-old", True, 777)]
        passes = ctl.running.controller.worker_state.passes
        await wait_for(lambda: ctl.running.controller.worker_state.passes > passes + 2, 10, "more passes")
        assert not [c for c in agent.commands if c.action == "start_shard"]
    finally:
        serving.cancel()
        await agent.close()


async def test_an_adopted_shards_gpus_count_as_allocated(ctl: Admin) -> None:
    # As after a controller restart: the agent reports a running shard holding GPUs 0 and 2 of three.
    running = ShardStatus(
        replica_id="sim-a-sim-gpu",
        model="sim-a",
        engine="sim",
        state="ready",
        pid=778,
        base_url="http://127.0.0.1:9",
        gpus=[0, 2],
    )
    agent = FakeAgent(ctl, "n1")
    agent.shards[running.shard_id] = running
    await agent.connect(shards=[running], gpus=[Gpu(index=i, gpu_class="l4") for i in range(3)])
    serving = asyncio.create_task(agent.serve())
    try:
        items = await wait_for(lambda: ctl.replicas("sim-a", "ready"), 10, "the adopted replica")
        assert [(r["id"], r["adopted"], r["gpus"]) for r in items] == [("sim-a-sim-gpu", True, [0, 2])]
        c = ctl.running.controller
        (view,) = views.replica_views(c)
        assert [s.gpus for s in view.shards] == [(0, 2)]
        # What placement starts from: only GPU 1 is free on n1.
        rooms = build_rooms(views.node_views(c), views.replica_views(c), {})
        assert rooms["n1"].free_gpus == {"l4": [1]}
    finally:
        serving.cancel()
        await agent.close()


async def test_demand_starts_an_on_demand_model(ctl: Admin, tmp_path: Path) -> None:
    files = {"cluster.yaml": cluster_yaml(), "b.yaml": model_yaml("sim-b", min_=0)}
    await ctl.post("/api/v1/apply", {"files": files}, expect=200)
    agent = FakeAgent(ctl, "n1")
    await agent.connect()
    serving = asyncio.create_task(agent.serve())
    try:
        passes = ctl.running.controller.worker_state.passes
        await wait_for(lambda: ctl.running.controller.worker_state.passes > passes + 1, 10, "passes")
        assert await ctl.replicas("sim-b") == []  # nothing until asked
        async with aiohttp.ClientSession() as s:
            async with s.post(ctl.url + "/api/v1/demand/sim-b") as r:
                assert r.status == 401
            async with s.post(ctl.url + "/api/v1/demand/nope", headers=ctl.headers) as r:
                assert r.status == 404
        reply = await ctl.post("/api/v1/demand/sim-b", expect=202)
        assert reply["model"] == "sim-b"
        await wait_for(lambda: ctl.replicas("sim-b", "ready"), 10, "sim-b loaded on demand")
        assert (await ctl.post("/api/v1/usage-seen", {"models": ["sim-b", "nope"]}, expect=200))["known"] == 1
    finally:
        serving.cancel()
        await agent.close()


async def test_a_replica_on_its_way_is_published_so_routers_hold_requests_for_it(ctl: Admin) -> None:
    # A router seeing a model's replica starting (a load, a scale-up) holds the model's requests for it.
    files = {"cluster.yaml": cluster_yaml(), "b.yaml": model_yaml("sim-b", min_=1)}
    await ctl.post("/api/v1/apply", {"files": files}, expect=200)
    agent = FakeAgent(ctl, "n1")
    agent.start_state = "starting"
    await agent.connect()
    serving = asyncio.create_task(agent.serve())
    try:
        on_its_way = await wait_for(
            lambda: _snapshot_where(ctl, lambda s: s["models"]["sim-b"]["starting"] == 1),
            10,
            "sim-b starting",
        )
        assert on_its_way["endpoints"] == []
        assert on_its_way["models"]["sim-b"]["load_seconds"] is None  # no load watched, none benched
        await wait_for(lambda: agent.shards, 10, "the shard started, reporting `starting`")
        assert (await _snapshot(ctl))["models"]["sim-b"]["starting"] == 1
        for shard_id, status in list(agent.shards.items()):
            agent.shards[shard_id] = status.model_copy(update={"state": "ready"})
        ready = await wait_for(
            lambda: _snapshot_where(
                ctl, lambda s: len(s["endpoints"]) == 1 and s["models"]["sim-b"]["load_seconds"] is not None
            ),
            10,
            "sim-b ready and published, with the load time the controller watched",
        )
        assert ready["models"]["sim-b"]["starting"] == 0
        assert ready["models"]["sim-b"]["load_seconds"] >= 0
    finally:
        serving.cancel()
        await agent.close()


async def _snapshot_where(ctl: Admin, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    snap = await _snapshot(ctl)
    return snap if ok(snap) else None


async def _snapshot(ctl: Admin) -> dict[str, Any]:
    url = ctl.url.replace("http://", "ws://") + "/router/v1"
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await s.ws_connect(url)  # no token
        assert refused.value.status == 401
    async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=ctl.headers) as ws:
        msg = await ws.receive(timeout=5)
        snap: dict[str, Any] = json.loads(msg.data)
        return snap


async def _node(ctl: Admin, name: str, state: str) -> bool:
    return await ctl.node_state(name) == state


async def _none(ctl: Admin) -> bool:
    return not await ctl.replicas()


async def test_mutual_tls_requires_a_certificate_naming_the_node(tmp_path: Path) -> None:
    from llmgw.adapters.ssh.ca import ClusterCA, client_context

    ca = ClusterCA.open(tmp_path / "ca")
    n1 = ca.node_cert("n1")
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "a.yaml": model_yaml("sim-a", min_=0)})
    running, _ = await start(settings_for(tmp_path, repo.path, ca_dir=tmp_path / "ca"))
    assert running.url.startswith("https://")
    url = running.url.replace("https://", "wss://") + "/agent/v1"
    headers = {"Authorization": f"Bearer {running.admin_token}"}
    trust_only = __import__("ssl").create_default_context(cafile=str(ca.cert_path))
    with_cert = client_context(n1.cert_path, n1.key_path, ca.cert_path)

    async def register(node: str, ctx: Any) -> Any:
        async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=headers, ssl=ctx) as ws:
            inv = Inventory(cpu_cores=1)
            await ws.send_str(dump(Register(node=node, agent_version="t", inventory=inv)))
            return parse_controller_message((await ws.receive(timeout=10)).data)

    try:
        refused = await register("n1", trust_only)
        assert refused.type == "refused" and "no client certificate" in refused.reason
        refused = await register("n2", with_cert)
        assert refused.type == "refused" and "for node 'n1', not 'n2'" in refused.reason
        assert (await register("n1", with_cert)).type == "welcome"
        ca.revoke("n1")
        refused = await register("n1", with_cert)
        assert refused.type == "refused" and "revoked" in refused.reason
    finally:
        await running.stop()


async def test_a_refused_start_is_retried_after_a_backoff_not_dropped(ctl: Admin) -> None:
    agent = FakeAgent(ctl, "n1")
    agent.refuse_start = "sim: unknown arg 'colour'"
    await agent.connect()
    serving = asyncio.create_task(agent.serve())
    try:

        def starts() -> int:
            return sum(1 for c in agent.commands if c.action == "start_shard")

        await wait_for(lambda: starts() >= 3, 20, "the start tried three times")
        status = await ctl.get("/api/v1/status")
        model = status["models"][0]
        assert model["health"] == "Degraded" and model["failures"] >= 2
        events = (await ctl.get("/api/v1/events"))["events"]
        assert any(e["kind"] == "replica_start_failed" and "unknown arg" in e["message"] for e in events)
        assert "llmgw_controller_reconcile_errors_total" in await ctl.metrics()

        agent.refuse_start = ""  # fixed: the next try succeeds
        await wait_for(lambda: ctl.replicas("sim-a", "ready"), 20, "sim-a ready once starts succeed")
        healthy = (await ctl.get("/api/v1/status"))["models"][0]
        assert healthy["health"] == "Healthy"
    finally:
        serving.cancel()
        await agent.close()


async def test_routers_report_use_on_the_stream(ctl: Admin) -> None:
    url = ctl.url.replace("http://", "ws://") + "/router/v1"
    controller = ctl.running.controller
    async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=ctl.headers) as ws:
        first = json.loads((await ws.receive(timeout=5)).data)
        assert controller.desired is not None and first["revision"] == controller.desired.revision
        await ws.send_str(json.dumps({"type": "usage", "models": ["sim-a", "unknown"]}))
        await wait_for(
            lambda: controller.worker_state.model("sim-a").used_at is not None, 5, "use of sim-a noted"
        )
        assert "unknown" not in controller.worker_state.models


async def test_changed_profile_marks_stale_and_restarts_only_when_asked(ctl: Admin) -> None:
    agent = FakeAgent(ctl, "n1")
    await agent.connect()
    serving = asyncio.create_task(agent.serve())
    try:
        first = (await wait_for(lambda: ctl.replicas("sim-a", "ready"), 10, "sim-a ready"))[0]
        changed = model_yaml("sim-a", min_=1).replace("decode_ms_per_token: 1", "decode_ms_per_token: 2")
        await ctl.post(
            "/api/v1/apply", {"files": {"cluster.yaml": cluster_yaml(), "a.yaml": changed}}, expect=200
        )

        async def stale() -> Any:
            items = await ctl.replicas("sim-a")
            return items if items and items[0]["stale_profile"] else None

        items = await wait_for(stale, 10, "the replica shown as stale profile")
        assert [r["id"] for r in items] == [first["id"]]  # shown, not churned
        events = (await ctl.get("/api/v1/events"))["events"]
        assert any(e["kind"] == "replica_stale" and e["object"] == first["id"] for e in events)

        restart = changed.replace("  scaling:", "  restart_on_profile_change: true\n  scaling:")
        await ctl.post(
            "/api/v1/apply", {"files": {"cluster.yaml": cluster_yaml(), "a.yaml": restart}}, expect=200
        )

        async def replaced() -> Any:
            items = await ctl.replicas("sim-a")
            ok = [r for r in items if r["state"] == "ready" and not r["stale_profile"]]
            return ok if len(items) == 1 and ok and ok[0]["id"] != first["id"] else None

        await wait_for(replaced, 20, "the stale replica replaced")
    finally:
        serving.cancel()
        await agent.close()


async def test_scale_down_drains_before_stopping(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "a.yaml": model_yaml("sim-a", min_=2)})
    running, admin = await start(settings_for(tmp_path, repo.path, drain_s=3.0))
    agent = FakeAgent(admin, "n1")
    await agent.connect()
    serving = asyncio.create_task(agent.serve())
    try:
        await wait_for(lambda: _count(admin, "ready", 2), 10, "two ready")
        repo.write({"a.yaml": model_yaml("sim-a", min_=1)})
        draining = (await wait_for(lambda: admin.replicas("sim-a", "draining"), 10, "one replica draining"))[
            0
        ]
        # Routers are told at once; the engine is not stopped until the drain time is over.
        snap = await _snapshot(admin)
        assert draining["id"] not in {e["replica_id"] for e in snap["endpoints"]}
        assert len(snap["endpoints"]) == 1
        assert not [c for c in agent.commands if c.action == "stop_shard"]
        await wait_for(
            lambda: [c for c in agent.commands if c.action == "stop_shard"], 10, "the stop after draining"
        )
        await wait_for(lambda: _count(admin, None, 1), 10, "one replica left")
    finally:
        serving.cancel()
        await agent.close()
        await running.stop()


async def _count(admin: Admin, state: str | None, n: int) -> bool:
    return len(await admin.replicas("sim-a", state)) == n
