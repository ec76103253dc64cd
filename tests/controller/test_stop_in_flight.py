"""A controller stopping lets the starts it already sent be answered before its agents' links close.

A start cut off there left a replica in the store that never ran; the next leader then started another beside
the replacement it rolled (a restart mid-rollout made five starts where four were due). Stopping now halts the
loop's decisions first, waits a bounded time for starts in flight, and only then closes the links."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support import wait_for

from .fake_agents import reconciling
from .helpers import Repo, cluster_yaml, model_yaml


def _repo(tmp: Path) -> Repo:
    repo = Repo(tmp / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/m.yaml": model_yaml("m", min_=1)})
    return repo


async def test_a_start_in_flight_is_answered_before_the_controller_stops(tmp_path: Path) -> None:
    from llmgw.controller.parts.desired import build_desired

    repo = _repo(tmp_path)
    async with reconciling(tmp_path, repo.path, {}, []) as (c, agents, reconciler):
        c.desired = build_desired(repo.path, "rev-1", "test")
        agents.start_answered = asyncio.Event()  # the agent is slow to answer
        agents.register("n1")
        await reconciler.pass_once()
        await wait_for(lambda: len(agents.started()) == 1, 10, "the start sent to n1")
        [sent] = agents.started()

        stopping = asyncio.create_task(reconciler.finish_in_flight(within=30))
        await wait_for(lambda: reconciler.halted, 10, "the loop halted")
        assert not stopping.done(), "finish_in_flight returned with a start unanswered"
        # Halted: a pass (a change notified meanwhile) decides nothing, however much is missing.
        agents.register("n2")
        assert await reconciler.pass_once() > 0 and len(agents.started()) == 1

        agents.start_answered.set()
        await asyncio.wait_for(stopping, 10)
        rec = c.replicas[sent.replica_id]
        assert not rec.error, rec.error
        # The agent has it, so the next leader adopts it rather than starting another.
        assert f"{sent.replica_id}-0" in agents.nodes["n1"].shards
        events = [e.kind for e in await c.store.recent_events()]
        assert "replica_start_failed" not in events, events


async def test_a_start_never_answered_holds_the_stop_only_as_long_as_allowed(tmp_path: Path) -> None:
    from llmgw.controller.parts.desired import build_desired

    repo = _repo(tmp_path)
    async with reconciling(tmp_path, repo.path, {}, []) as (c, agents, reconciler):
        c.desired = build_desired(repo.path, "rev-1", "test")
        agents.start_answered = asyncio.Event()  # never set: an agent that does not answer
        agents.register("n1")
        await reconciler.pass_once()
        await wait_for(lambda: len(agents.started()) == 1, 10, "the start sent to n1")
        await asyncio.wait_for(reconciler.finish_in_flight(within=0.2), 10)
        assert reconciler.in_flight == 1  # still waiting; close() (after the links) cancels it
