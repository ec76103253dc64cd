"""A controller stopping lets the pass under way end and the starts it sent be answered before its agents'
links close.

A start cut off there left a replica in the store that never ran; the next leader then started another beside
the replacement it rolled (a restart mid-rollout made five starts where four were due). Stopping now halts the
loop (no pass begins), waits a bounded time for the pass under way and the starts in flight, and only then
closes the links."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import wait_for

from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired

from .fake_agents import FakeAgents, reconciling
from .helpers import Repo, cluster_yaml, model_yaml


@pytest.fixture
async def loop(tmp_path: Path) -> AsyncIterator[tuple[Controller, FakeAgents, Reconciler]]:
    """A reconciler on one model of one replica, with agents slow to answer starts until the test says."""
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/m.yaml": model_yaml("m", min_=1)})
    async with reconciling(tmp_path, repo.path, {}, []) as (c, agents, reconciler):
        c.desired = build_desired(repo.path, "rev-1", "test")
        agents.start_answered = asyncio.Event()
        yield c, agents, reconciler


async def _delivered(c: Controller, agents: FakeAgents, replica_id: str) -> None:
    """The agent has the replica (so the next leader adopts it) and no start failed."""
    rec = c.replicas[replica_id]
    assert not rec.error, rec.error
    assert f"{replica_id}-0" in agents.nodes["n1"].shards
    events = [e.kind for e in await c.store.recent_events()]
    assert "replica_start_failed" not in events, events


async def test_a_start_in_flight_is_answered_before_the_controller_stops(
    loop: tuple[Controller, FakeAgents, Reconciler],
) -> None:
    c, agents, reconciler = loop
    running = asyncio.create_task(reconciler.run())
    agents.register("n1")
    await wait_for(lambda: len(agents.started()) == 1, 10, "the start sent to n1")
    [sent] = agents.started()

    stopping = asyncio.create_task(reconciler.finish_in_flight(within=30))
    await asyncio.wait_for(running, 10)  # the loop ends: no pass begins once halted
    assert not stopping.done(), "finish_in_flight returned with a start unanswered"
    agents.register("n2")  # a change that would have started more
    assert len(agents.started()) == 1

    assert agents.start_answered is not None
    agents.start_answered.set()
    await asyncio.wait_for(stopping, 10)
    await _delivered(c, agents, sent.replica_id)


async def test_the_pass_under_way_ends_and_its_start_is_answered(
    loop: tuple[Controller, FakeAgents, Reconciler],
) -> None:
    c, agents, reconciler = loop
    agents.register("n1")
    # A pass under way as the stop begins, between its decisions and its starts.
    async with reconciler.in_pass:
        stopping = asyncio.create_task(reconciler.finish_in_flight(within=30))
        await wait_for(lambda: reconciler.halted, 10, "the loop halted")
        await reconciler.pass_once()  # the rest of that pass: it sends its start
        assert not stopping.done(), "finish_in_flight returned with a pass under way"
    await wait_for(lambda: len(agents.started()) == 1, 10, "the start sent to n1")
    assert not stopping.done(), "finish_in_flight returned with a start unanswered"
    assert agents.start_answered is not None
    agents.start_answered.set()
    await asyncio.wait_for(stopping, 10)
    [sent] = agents.started()
    await _delivered(c, agents, sent.replica_id)


async def test_a_start_never_answered_holds_the_stop_only_as_long_as_allowed(
    loop: tuple[Controller, FakeAgents, Reconciler],
) -> None:
    _, agents, reconciler = loop
    agents.register("n1")
    await reconciler.pass_once()
    await wait_for(lambda: len(agents.started()) == 1, 10, "the start sent to n1")
    await asyncio.wait_for(reconciler.finish_in_flight(within=0.2), 10)
    assert reconciler.in_flight == 1  # still waiting for its answer: close() (after the links) cancels it
