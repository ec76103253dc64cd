"""The autoscaler in the reconcile loop (fake agents, real controller and store): routers' load reports move the
count, scale-down drains until no router has a request on the replica, and status shows the decision and the
fleet's capacity."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from llmgw_agent.protocol import Gpu
from support import wait_for

from llmgw.controller.core import Controller
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.status import fleet as views
from llmgw.controller.wire.publisher import note_load
from llmgw.store.store import Store

from .fake_agents import FakeAgents
from .helpers import Repo, cluster_yaml, settings_for
from .test_reconcile_loop import Loop

SCALED = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: m}
spec:
  context_length: 4096
  scaling: {min: 1, max: 3}
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, args: {max_concurrency: 2}}
"""


@pytest.fixture
async def loop(tmp_path: Path) -> AsyncIterator[Loop]:
    repo = Repo(tmp_path / "repo", use_git=False)
    # No cool-downs: each pass decides on the report it has; a long drain, ended only by the reports.
    settings = settings_for(tmp_path, repo.path, scale_up_cooldown_s=0, scale_down_cooldown_s=0, drain_s=30.0)
    store = await Store.open(settings.store)
    agents = FakeAgents(clock=time.monotonic)
    controller = Controller(settings, store, ControllerMetrics(), admin_token="admin", agents=agents)
    agents.on_change = controller.notify
    lp = Loop(tmp_path, controller, agents, repo)
    lp.apply({"cluster.yaml": cluster_yaml(), "models/m.yaml": SCALED})
    yield lp
    await lp.reconciler.close()
    await controller.stop_background()
    await store.close()


def load(
    models: dict[str, tuple[int, int]], replicas: dict[str, tuple[int, bool]] | None = None
) -> dict[str, Any]:
    return {
        "type": "load",
        "models": {
            m: {"queued": q, "inflight": i, "ttft_p99_ms": None, "refused": 0} for m, (q, i) in models.items()
        },
        "replicas": {
            r: {"inflight": n, "last_request_at": time.time() - 5, "routed": routed}
            for r, (n, routed) in (replicas or {}).items()
        },
    }


def ready_all(lp: Loop) -> None:
    for s in lp.agents.started():
        if s.replica_id in lp.c.replicas:
            lp.agents.report(s.node, s.replica_id, "ready")


async def test_load_reports_scale_out_and_the_drain_waits_for_the_last_request(loop: Loop) -> None:
    c = loop.c
    loop.agents.register("n1")
    await loop.settle()
    ready_all(loop)
    assert views.model_health(c, "m")["autoscale"]["reason"] == "held at 1: no load report"

    assert note_load(c, "router-1", load({"m": (5, 2)}))
    await loop.settle()
    assert len(loop.agents.started()) == 3  # ceil(7 / 2) = 4, max 3
    ready_all(loop)
    events = [e for e in c.events.items if e["kind"] == "model_scaled"]
    assert [e["message"] for e in events] == [
        "scaled m 1->3: queue 5, in flight 2, capacity 2 per replica (slots)"
    ]
    assert (
        c.metrics.registry.get_sample_value(
            "llmgw_controller_scale_events_total", {"model": "m", "direction": "up"}
        )
        == 1
    )

    # The load falls to one sequence: down to 1. The two idlest go; one still has a request in flight.
    ids = sorted(c.replicas)
    busy, idle, keep = ids[0], ids[1], ids[2]
    report = {busy: (1, True), idle: (0, True), keep: (3, True)}
    note_load(c, "router-1", load({"m": (0, 1)}, report))
    await loop.reconciler.pass_once()
    stopping = sorted(r.id for r in c.replicas.values() if r.stopping)
    assert stopping == sorted([busy, idle])
    # The router no longer routes to them; the idle one has nothing in flight, the busy one still has one.
    note_load(c, "router-1", load({"m": (0, 1)}, {busy: (1, False), keep: (3, True)}))
    await wait_for(lambda: idle not in c.replicas, 10, f"{idle} stopped once drained")
    assert busy in c.replicas and not [s for s in loop.agents.stopped() if s.replica_id == busy]
    note_load(c, "router-1", load({"m": (0, 1)}, {keep: (3, True)}))
    await wait_for(lambda: busy not in c.replicas, 10, f"{busy} stopped once its last request ended")
    assert list(c.replicas) == [keep]


async def test_a_malformed_load_report_is_dropped_and_an_old_one_is_unknown(loop: Loop) -> None:
    c = loop.c
    loop.agents.register("n1")
    await loop.settle()
    assert not note_load(c, "router-1", {"type": "load", "models": {"m": {"queued": -3}}})
    assert c.worker_state.loads == {}
    note_load(c, "router-1", load({"m": (40, 0)}))
    # A report older than load_stale is unknown: the count is held where it is.
    old = c.worker_state.loads["router-1"]
    aged = {m: replace(d, at=d.at - 60) for m, d in old.models.items()}
    c.worker_state.loads["router-1"] = replace(old, at=old.at - 60, models=aged)
    await loop.settle()
    assert len(loop.agents.started()) == 1
    assert "load report 60s old" in views.model_health(c, "m")["autoscale"]["reason"]


GPU_MODELS = {
    "models/g.yaml": """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: g}
spec:
  context_length: 4096
  class: interactive
  profiles:
    - {name: h, engine: sim, gpu_class: h100, gpus: 2, tp: 2}
""",
    "models/big.yaml": """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: big}
spec:
  context_length: 4096
  profiles:
    - {name: h, engine: sim, gpu_class: h100, gpus: 8, tp: 8}
""",
}


async def test_status_shows_capacity_per_gpu_class_free_nodes_unplaceable_and_idle(loop: Loop) -> None:
    c = loop.c
    loop.apply({"models/m.yaml": None, **GPU_MODELS})
    gpus = [Gpu(index=i, gpu_class="h100", memory_bytes=80 << 30) for i in range(4)]
    n1 = loop.agents.register("n1")
    n1.inventory = n1.inventory.model_copy(update={"gpus": gpus})
    loop.agents.register("n2")
    await loop.settle()
    ready_all(loop)
    await loop.settle()
    cap = views.status_json(c)["capacity"]
    assert cap["gpus"] == {"h100": {"total": 4, "used": 2, "free": 2, "by_class": {"interactive": 2}}}
    assert cap["cpu_cores"]["total"] == 16 and cap["cpu_cores"]["nodes_unknown"] == 0
    assert cap["free_nodes"] == {"-": ["n2"]}
    assert set(cap["unplaceable"]) == {"big"} and cap["unplaceable"]["big"]["reasons"]
    [rid] = list(c.replicas)
    assert cap["replicas_by_idleness"] == [{"replica": rid, "model": "g", "inflight": None, "idle_s": None}]
    note_load(c, "router-1", load({"g": (0, 0)}, {rid: (0, True)}))
    [idle] = views.status_json(c)["capacity"]["replicas_by_idleness"]
    assert idle["inflight"] == 0 and idle["idle_s"] is not None and idle["idle_s"] >= 5
