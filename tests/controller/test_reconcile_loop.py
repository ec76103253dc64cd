"""The reconcile loop against a fake AgentClient: placement, removal, adoption and backoff, no sockets.

The controller, its store (SQLite in tmp) and the desired state are real; only the agents are the fake in
fake_agents.py, so each pass's commands can be read directly."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llmgw_agent.protocol import ShardStatus
from support import wait_for

from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.status import fleet as views
from llmgw.store.store import Store

from .fake_agents import FakeAgents
from .helpers import Repo, cluster_yaml, model_yaml, settings_for


class Loop:
    def __init__(self, tmp: Path, controller: Controller, agents: FakeAgents, repo: Repo) -> None:
        self.tmp, self.c, self.agents, self.repo = tmp, controller, agents, repo
        self.reconciler = Reconciler(controller)
        agents.on_register = self.reconciler.adopt  # as app.py wires the hub
        self.revisions = 0

    def apply(self, files: dict[str, str | None]) -> None:
        self.repo.write(files)
        self.revisions += 1
        self.c.desired = build_desired(self.repo.path, f"rev-{self.revisions}", "test")

    async def settle(self) -> None:
        """One pass, then the commands it spawned have been carried out."""
        await self.reconciler.pass_once()
        await wait_for(lambda: self.reconciler.in_flight == 0, 10, "the pass's commands to finish")


@pytest.fixture
async def loop(tmp_path: Path) -> AsyncIterator[Loop]:
    repo = Repo(tmp_path / "repo", use_git=False)
    settings = settings_for(tmp_path, repo.path)
    store = await Store.open(settings.store)
    agents = FakeAgents(clock=time.monotonic)
    controller = Controller(settings, store, ControllerMetrics(), admin_token="admin", agents=agents)
    agents.on_change = controller.notify
    lp = Loop(tmp_path, controller, agents, repo)
    lp.apply({"cluster.yaml": cluster_yaml(), "models/m.yaml": model_yaml("m", min_=1)})
    yield lp
    await lp.reconciler.close()
    await controller.stop_background()
    await store.close()


async def test_a_model_placed_on_a_registered_node_is_started_there(loop: Loop) -> None:
    loop.agents.register("n1")
    await loop.settle()
    [sent] = loop.agents.started()
    assert (sent.node, sent.spec is not None and sent.spec.model) == ("n1", "m")
    rec = loop.c.replicas[sent.replica_id]
    assert rec.nodes == ("n1",) and not rec.adopted
    assert sent.spec is not None and sent.spec.api_key  # each replica gets its own engine key
    await loop.settle()  # the shard reports starting: nothing is started a second time
    assert len(loop.agents.started()) == 1
    stored = {r.id: r.state for r in await loop.c.store.list_replicas()}
    assert stored == {sent.replica_id: "starting"}


async def test_a_model_removed_from_the_repo_has_its_replica_stopped(loop: Loop) -> None:
    loop.agents.register("n1")
    await loop.settle()
    [sent] = loop.agents.started()
    loop.agents.report("n1", sent.replica_id, "ready")
    loop.apply({"models/m.yaml": None})
    await loop.settle()  # drains (drain_s), then stops
    assert [(s.node, s.replica_id) for s in loop.agents.stopped()] == [("n1", sent.replica_id)]
    assert sent.replica_id not in loop.c.replicas
    assert await loop.c.store.list_replicas() == []
    assert [e["kind"] for e in loop.c.events.items if e["object"] == sent.replica_id][-1] == "replica_stop"


async def test_a_shard_running_at_register_is_adopted_not_started_again(loop: Loop) -> None:
    d = loop.c.desired
    assert d is not None
    fingerprint = d.models["m"].profiles[0].fingerprint
    running = ShardStatus(
        replica_id="m-sim-abc123", model="m", engine="sim", state="ready", pid=77, fingerprint=fingerprint
    )
    loop.agents.register("n1", shards=[running])
    rec = loop.c.replicas["m-sim-abc123"]
    assert rec.adopted and rec.profile == "sim" and rec.nodes == ("n1",)
    await loop.settle()
    assert loop.agents.started() == [] and loop.agents.stopped() == []
    assert views.model_health(loop.c, "m")["health"] == "Healthy"


async def test_a_start_the_agent_refuses_backs_off_before_the_next_attempt(loop: Loop) -> None:
    loop.agents.register("n1")
    loop.agents.refuse_start["n1"] = "engine sim not installed"
    await loop.settle()
    [first] = loop.agents.started()
    assert "engine sim not installed" in loop.c.replicas[first.replica_id].error
    await loop.settle()  # the failed replica is given up; its replacement waits for the backoff
    record = loop.c.worker_state.models["m"]
    assert record.backoff is not None and record.backoff.failures == 1
    health = views.model_health(loop.c, "m")
    assert (health["health"], health["failures"]) == ("Degraded", 1)
    await loop.settle()
    assert len(loop.agents.started()) == 1, "a second start before the backoff ended"
    kinds = [e["kind"] for e in loop.c.events.items]
    assert "replica_start_failed" in kinds and "replica_failed" in kinds


async def test_a_canary_model_reads_unknown_until_the_canary_runs_are_read(loop: Loop) -> None:
    """Taking over as leader, a controller has not yet read the last leader's canary runs: whether a canary
    runs or holds the model is unknown then, not none; a model without a canary rollout says none."""
    canary = (
        "\n  rollout:\n    strategy: canary\n    canary: {weight: 50, duration: 5s, gates: {min_requests: 0}}"
    )
    loop.apply({"models/c.yaml": model_yaml("c", min_=1, extra=canary)})
    loop.c.worker_state.earlier_state_read = False
    unread = views.model_health(loop.c, "c")["canary"]
    assert unread["phase"] == "unknown" and "not read yet" in unread["waiting"], unread
    assert views.model_health(loop.c, "m")["canary"] is None
    assert await loop.c.load_earlier_state()
    assert views.model_health(loop.c, "c")["canary"] is None  # read: the store holds no run for it


async def test_a_canary_models_health_is_unknown_while_its_stale_replicas_may_be_held(loop: Loop) -> None:
    """A canary model whose replicas are stale after a change: until the canary runs are read, whether they
    are the stable ones a failed canary holds it on (then it is not rolling) or about to roll is not known,
    so its health is Unknown, not a guessed Progressing. Read, with no run held, it rolls: Progressing."""
    canary = (
        "\n  rollout:\n    strategy: canary\n    canary: {weight: 50, duration: 5s, gates: {min_requests: 0}}"
    )
    loop.agents.register("n1")
    loop.apply({"models/c.yaml": model_yaml("c", min_=1, extra=canary)})
    await loop.settle()
    assert any(r.model == "c" for r in loop.c.replicas.values())
    loop.apply({"models/c.yaml": model_yaml("c", min_=1, cores=2, extra=canary)})  # a change: stale now
    loop.c.worker_state.earlier_state_read = False
    assert views.model_health(loop.c, "c")["health"] == "Unknown"
    assert views.model_health(loop.c, "m")["health"] != "Unknown"  # no canary rollout: nothing unread
    assert await loop.c.load_earlier_state()
    assert views.model_health(loop.c, "c")["health"] == "Progressing"
