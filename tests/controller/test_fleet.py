"""The controller with real agents (several on this machine, fake inventories) and sim engines."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support import free_port, pid_alive, wait_for

from llmgw.adapters.repo_files import load_repo
from llmgw.core.fleet.views import LiveState
from llmgw.core.plan import plan_for_catalog

from .helpers import Admin, Agents, Repo, cluster_yaml, model_yaml, settings_for, start

pytestmark = pytest.mark.integration


class Fleet:
    def __init__(self, tmp: Path, dsn: str) -> None:
        self.tmp = tmp
        self.repo = Repo(tmp / "origin", use_git=True)
        self.port = free_port()
        self.settings = settings_for(tmp, self.repo.path, listen=f"127.0.0.1:{self.port}", store=dsn)
        self.agents = Agents(tmp, tmp / "token")
        self.running: Any = None
        self.admin: Admin | None = None

    async def start_controller(self) -> Admin:
        self.running, self.admin = await start(self.settings)
        return self.admin

    async def stop_controller(self) -> None:
        if self.running is not None:
            await self.running.stop()
            self.running = None

    def start_agent(self, node: str) -> None:
        self.agents.start(node, f"127.0.0.1:{self.port}")

    async def wait_ready(self, model: str, count: int, what: str = "") -> list[dict[str, Any]]:
        assert self.admin is not None
        admin = self.admin

        async def ready() -> list[dict[str, Any]] | None:
            items = await admin.replicas(model)
            good = [r for r in items if r["state"] == "ready"]
            return good if len(good) == count and len(items) == count else None

        found: list[dict[str, Any]] = await wait_for(ready, 60, what or f"{count} ready replicas of {model}")
        return found


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    f = Fleet(tmp_path, f"sqlite:///{tmp_path / 'controller.db'}")
    try:
        yield f
    finally:
        await f.stop_controller()
        f.agents.cleanup()


@pytest.fixture
async def fleet_any_store(tmp_path: Path, controller_dsn: str) -> AsyncIterator[Fleet]:
    """A fleet whose controller keeps its state in SQLite or in PostgreSQL."""
    f = Fleet(tmp_path, controller_dsn)
    try:
        yield f
    finally:
        await f.stop_controller()
        f.agents.cleanup()


async def _bring_up(fleet: Fleet, nodes: list[str], unreachable: str = "10s", lost: str = "60s") -> Admin:
    """Controller on a repo with no models, agents connected, then the model committed (so placement sees
    every node, as it would on a running cluster)."""
    # Long expiry unless the test is about expiry: a loaded machine must not make a node look Lost.
    fleet.repo.write({"cluster.yaml": cluster_yaml(unreachable=unreachable, lost=lost)}, "cluster")
    admin = await fleet.start_controller()
    for node in nodes:
        fleet.start_agent(node)

    async def all_ready() -> bool:
        return all([await admin.node_state(n) == "Ready" for n in nodes])

    await wait_for(all_ready, 30, f"nodes {nodes} Ready")
    return admin


async def test_min_two_placed_on_two_nodes_replaced_after_kill_and_stopped_on_removal(fleet: Fleet) -> None:
    admin = await _bring_up(fleet, ["n1", "n2"])
    fleet.repo.write({"models/a.yaml": model_yaml("sim-a", min_=2)}, "add sim-a")
    ready = await fleet.wait_ready("sim-a", 2)
    assert sorted(r["node"] for r in ready) == ["n1", "n2"]
    assert all(r["pid"] and pid_alive(r["pid"]) for r in ready)

    # Routers are told: the snapshot carries both endpoints, each with the key its engine demands.
    snap = await _router_snapshot(fleet, lambda s: len(s["endpoints"]) == 2)
    assert {e["replica_id"] for e in snap["endpoints"]} == {r["id"] for r in ready}
    endpoint = snap["endpoints"][0]
    async with aiohttp.ClientSession() as s:
        async with s.get(endpoint["base_url"] + "/v1/models") as r:
            assert r.status == 401  # the engine refuses anyone without its key
        headers = {"Authorization": f"Bearer {endpoint['api_key']}"}
        async with s.get(endpoint["base_url"] + "/v1/models", headers=headers) as r:
            assert r.status == 200

    victim = ready[0]
    os.kill(victim["pid"], signal.SIGKILL)
    replaced = await wait_for(
        lambda: _ready_without(admin, "sim-a", victim["id"], 2), 60, "the killed replica replaced"
    )
    assert victim["id"] not in {r["id"] for r in replaced}
    events = (await admin.get("/api/v1/events"))["events"]
    assert any(e["kind"] == "replica_failed" and e["object"] == victim["id"] for e in events)
    assert 'llmgw_controller_replica_restarts_total{model="sim-a"} 1.0' in await admin.metrics()

    pids = [r["pid"] for r in replaced]
    fleet.repo.write({"models/a.yaml": None}, "remove sim-a")
    await wait_for(lambda: _none_of(admin, "sim-a"), 60, "sim-a's replicas stopped")
    await wait_for(lambda: not any(pid_alive(p) for p in pids), 30, "the engines gone")


async def test_stopped_agent_goes_unreachable_then_lost_and_its_replicas_move(fleet: Fleet) -> None:
    admin = await _bring_up(fleet, ["n1", "n2", "n3"], unreachable="2s", lost="5s")
    fleet.repo.write({"models/a.yaml": model_yaml("sim-a", min_=2)}, "add sim-a")
    ready = await fleet.wait_ready("sim-a", 2)
    gone = ready[0]["node"]
    fleet.agents.stop(gone, signal.SIGKILL)  # silent, as a machine that lost its network

    await wait_for(lambda: _node_is(admin, gone, "Unreachable"), 30, f"{gone} Unreachable")
    # Unreachable is not Lost: its replica is kept, nothing is started in its place yet.
    items = await admin.replicas("sim-a")
    assert {r["id"] for r in items} == {r["id"] for r in ready}
    await wait_for(lambda: _node_is(admin, gone, "Lost"), 30, f"{gone} Lost")

    moved = await fleet.wait_ready("sim-a", 2, "sim-a ready again without the lost node")
    assert gone not in {r["node"] for r in moved}
    assert len({r["node"] for r in moved}) == 2
    metrics = await admin.metrics()
    assert 'llmgw_controller_nodes{state="Lost"} 1.0' in metrics


async def test_controller_restart_adopts_running_engines(fleet_any_store: Fleet) -> None:
    fleet = fleet_any_store
    admin = await _bring_up(fleet, ["n1", "n2"])
    fleet.repo.write({"models/a.yaml": model_yaml("sim-a", min_=2)}, "add sim-a")
    before = {r["id"]: r["pid"] for r in await fleet.wait_ready("sim-a", 2)}

    await fleet.stop_controller()
    restarted_at = time.time()
    admin = await fleet.start_controller()

    async def adopted() -> list[dict[str, Any]] | None:
        items = await admin.replicas("sim-a")
        ok = len(items) == 2 and all(r["adopted"] and r["state"] == "ready" for r in items)
        return items if ok else None

    items = await wait_for(adopted, 60, "both replicas adopted")
    assert {r["id"]: r["pid"] for r in items} == before
    # Several passes later nothing was restarted or added.
    passes = (await admin.get("/api/v1/status"))["reconcile"]["passes"]
    await wait_for(lambda: _passes_over(admin, passes + 3), 30, "three more reconcile passes")
    assert {r["id"]: r["pid"] for r in await admin.replicas("sim-a")} == before
    assert all(pid_alive(p) for p in before.values())
    events = [e for e in (await admin.get("/api/v1/events"))["events"] if e["time"] >= restarted_at]
    assert not any(e["kind"] == "replica_start" for e in events)
    assert sum(e["kind"] == "replica_adopted" for e in events) == 2


async def test_a_node_removed_while_no_controller_ran_is_kept_and_said_so(fleet: Fleet) -> None:
    """The rule (docs/controller.md, Leaving): the controller removes only remote nodes its applied revision
    declared; a node whose Node went while no controller ran is an undeclared agent like any other, left as
    it is. What must not happen is a status or plan that reads as if it were drained."""
    node = "apiVersion: llmgw/v1\nkind: Node\nmetadata: {name: n1}\nspec: {local: true}\n"
    fleet.repo.write({"cluster.yaml": cluster_yaml(unreachable="10s", lost="60s"), "nodes/n1.yaml": node})
    admin = await fleet.start_controller()
    fleet.start_agent("n1")
    await wait_for(lambda: _node_is(admin, "n1", "Ready"), 30, "n1 Ready")
    fleet.repo.write({"models/a.yaml": model_yaml("sim-a", min_=1)}, "add sim-a")
    before = {r["id"]: r["pid"] for r in await fleet.wait_ready("sim-a", 1)}
    assert (await admin.get("/api/v1/status"))["undeclared_nodes"] == []

    await fleet.stop_controller()
    fleet.repo.write({"nodes/n1.yaml": None}, "remove n1")
    admin = await fleet.start_controller()
    items = await fleet.wait_ready("sim-a", 1, "the replica on n1 adopted")
    assert {r["id"]: r["pid"] for r in items} == before and items[0]["adopted"]
    passes = (await admin.get("/api/v1/status"))["reconcile"]["passes"]
    await wait_for(lambda: _passes_over(admin, passes + 3), 30, "three more reconcile passes")
    assert {r["id"]: r["pid"] for r in await admin.replicas("sim-a")} == before
    assert all(pid_alive(p) for p in before.values())

    (kept,) = (await admin.get("/api/v1/status"))["undeclared_nodes"]
    assert (kept["node"], kept["replicas"], kept["action"]) == ("n1", 1, "keep")
    assert kept["message"].startswith("not declared in the repo, left as it is: its 1 replica keeps running")
    live = LiveState.model_validate(await admin.get("/api/v1/state"))
    assert [(n.name, n.if_undeclared) for n in live.nodes] == [("n1", "keep")]
    loaded = load_repo(fleet.repo.path)
    assert loaded.catalog is not None, loaded.errors
    plan = plan_for_catalog(loaded.catalog, live)
    assert plan.nodes == () and plan.stops == () and [n.node for n in plan.kept] == ["n1"]
    assert plan.summary() == "No changes. 1 node not declared in the repo left as it is."


async def test_a_removed_nodes_replica_is_replaced_before_it_stops(fleet: Fleet) -> None:
    """Make-before-break: a model at min 1 on a node removed from the repo keeps a ready replica throughout."""
    # The agents connect before their Nodes are declared, so nothing is bootstrapped over SSH; teardown's
    # SSH later finds nobody on `closed` (the removal ends failed, after the drain this test is about).
    admin = await _bring_up(fleet, ["n1", "n2"])
    closed = free_port()
    node = "apiVersion: llmgw/v1\nkind: Node\nmetadata: {name: %s}\nspec: {address: 127.0.0.1, ssh: {port: %d}}\n"
    fleet.repo.write({f"nodes/{n}.yaml": node % (n, closed) for n in ("n1", "n2")}, "declare n1, n2")

    async def declared() -> bool:
        return all(n["declared"] for n in (await admin.get("/api/v1/nodes"))["nodes"])

    await wait_for(declared, 30, "n1 and n2 declared")
    fleet.repo.write({"models/a.yaml": model_yaml("sim-a", min_=1)}, "add sim-a")
    (old,) = await fleet.wait_ready("sim-a", 1)
    gone = old["node"]
    fleet.repo.write({f"nodes/{gone}.yaml": None}, f"remove {gone}")

    async def moved() -> list[dict[str, Any]] | None:
        items = await admin.replicas("sim-a")
        ready = [r for r in items if r["state"] == "ready"]
        assert ready, f"no ready replica of sim-a while {gone} was removed: {items}"
        return ready if [r["id"] for r in items] == [r["id"] for r in ready] != [old["id"]] else None

    (new,) = await wait_for(moved, 60, f"sim-a moved off {gone}")
    assert new["node"] != gone and new["id"] != old["id"]
    kinds = [
        (e["kind"], e["object"]) for e in reversed((await admin.get("/api/v1/events?limit=200"))["events"])
    ]
    assert kinds.index(("replica_start", new["id"])) < kinds.index(("replica_stop", old["id"]))
    assert ("node_removing", gone) in kinds


async def _router_snapshot(fleet: Fleet, predicate: Any) -> dict[str, Any]:
    assert fleet.running is not None
    url = fleet.running.url + "/router/v1"
    headers = {"Authorization": f"Bearer {fleet.running.admin_token}"}
    async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=headers) as ws:
        while True:
            msg = await ws.receive(timeout=30)
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            snap: dict[str, Any] = json.loads(msg.data)
            if predicate(snap):
                return snap


async def _ready_without(admin: Admin, model: str, gone: str, count: int) -> list[dict[str, Any]] | None:
    items = await admin.replicas(model)
    ready = [r for r in items if r["state"] == "ready"]
    ok = len(items) == count and len(ready) == count and gone not in {r["id"] for r in items}
    return ready if ok else None


async def _none_of(admin: Admin, model: str) -> bool:
    return not await admin.replicas(model)


async def _node_is(admin: Admin, node: str, state: str) -> bool:
    return await admin.node_state(node) == state


async def _passes_over(admin: Admin, n: int) -> bool:
    return bool((await admin.get("/api/v1/status"))["reconcile"]["passes"] >= n)
