"""The controller asks for KV-cache events where routing needs them, and tells routers where they are published.
The reconcile loop against the fake AgentClient (tests/controller/fake_agents.py): the repo, the controller and
its store are real. A model whose routing policy weighs prefixes gets `kv_events` (with the policy's hash seed)
in its shard specs; one that does not gets none; a ready replica whose agent reports its relay is published to
routers as the relay's URL on the serving port, one that reports none (or only a publisher port, as an agent
before the relay did) is published without."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import wait_for

from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.wire.publisher import endpoints
from llmgw.store.store import Store

from .fake_agents import FakeAgents
from .helpers import Repo, cluster_yaml, model_yaml, settings_for

POLICIES = """\
apiVersion: llmgw/v1
kind: RoutingPolicy
metadata: {name: prefix}
spec:
  picker: max_score
  weights: {prefix: 4, inflight: 1}
  prefix: {hash_seed: "42"}
---
apiVersion: llmgw/v1
kind: RoutingPolicy
metadata: {name: plain}
spec:
  picker: max_score
  weights: {inflight: 1}
"""


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[Controller, FakeAgents, Reconciler]]:
    repo = Repo(tmp_path / "repo", use_git=False)
    settings = settings_for(tmp_path, repo.path)
    store = await Store.open(settings.store)
    agents = FakeAgents(clock=time.monotonic)
    c = Controller(settings, store, ControllerMetrics(), admin_token="admin", agents=agents)
    agents.on_change = c.notify
    reconciler = Reconciler(c)
    agents.on_register = reconciler.adopt
    repo.write(
        {
            "cluster.yaml": cluster_yaml(),
            "policies.yaml": POLICIES,
            "models/shared.yaml": model_yaml("shared", 1, extra="\n  routing_policy: prefix"),
            "models/chat.yaml": model_yaml("chat", 1, extra="\n  routing_policy: plain"),
        }
    )
    c.desired = build_desired(repo.path, "rev-1", "test")
    yield c, agents, reconciler
    await reconciler.close()
    await c.stop_background()
    await store.close()


async def test_prefix_models_ask_for_kv_events_and_routers_are_told_where(
    setup: tuple[Controller, FakeAgents, Reconciler],
) -> None:
    c, agents, reconciler = setup
    agents.register("n1")
    await reconciler.pass_once()
    await wait_for(lambda: reconciler.in_flight == 0, 10, "the pass's commands to finish")
    sent = {s.spec.model: s for s in agents.started() if s.spec is not None}
    assert set(sent) == {"shared", "chat"}
    shared, chat = sent["shared"].spec, sent["chat"].spec
    assert shared is not None and chat is not None
    assert shared.kv_events is not None and shared.kv_events.hash_seed == "42"
    assert chat.kv_events is None

    link = agents.nodes["n1"]
    relay = {"kv_events_port": 21007, "kv_events_path": "/llmgw/kv-events"}
    before_the_relay = {"kv_events_port": 21008}
    for s, events in ((sent["shared"], relay), (sent["chat"], before_the_relay)):
        shard_id = f"{s.replica_id}-0"
        link.shards[shard_id] = link.shards[shard_id].model_copy(
            update={"host": "10.0.0.5", "base_url": "http://10.0.0.5:21000", **events}
        )
        agents.report("n1", s.replica_id, "ready")
    published = {e.model: e for e in endpoints(c)}
    # the relay on the serving port, behind the engine key; never the publisher's own port (127.0.0.1 only)
    assert published["shared"].kv_events == "http://10.0.0.5:21000/llmgw/kv-events"
    assert published["chat"].kv_events is None
