"""The controller's task set and records, alone: what the loops rely on them for."""

from __future__ import annotations

import asyncio
import logging

import pytest

from llmgw.controller.parts.background import Background
from llmgw.controller.parts.state import WorkerState
from llmgw.core.fleet.views import ModelState


async def test_background_close_cancels_and_awaits_every_task_and_its_cleanup() -> None:
    bg = Background("test")
    cleaned: list[str] = []

    async def work(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits still runs to its end
            cleaned.append(name)

    bg.spawn(work("a"))
    bg.spawn(work("b"), key="node-b")
    await asyncio.sleep(0)
    assert len(bg) == 2 and set(bg.named) == {"node-b"}
    await bg.close()
    assert sorted(cleaned) == ["a", "b"] and len(bg) == 0 and bg.named == {}


async def test_background_forgets_a_finished_task_and_logs_a_failed_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bg = Background("test")

    async def fails() -> None:
        raise RuntimeError("boom")

    async def done() -> None:
        return None

    caplog.set_level(logging.ERROR, "llmgw.controller")
    tasks = [bg.spawn(fails(), key="x"), bg.spawn(done())]
    await asyncio.wait(tasks)
    await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
    assert len(bg) == 0 and bg.named == {}
    assert any("boom" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


def test_worker_state_keeps_one_record_per_model() -> None:
    ws = WorkerState()
    ws.model("a").demand_at = 10.0
    ws.model("a").used_at = 4.0
    ws.model("b").used_at = 7.0
    ws.model("c").backoff = ModelState(failures=2, not_before=30.0)
    assert ws.demand() == {"a": 10.0}
    assert ws.last_used() == {"a": 10.0, "b": 7.0}
    assert ws.backoff() == {"c": ModelState(failures=2, not_before=30.0)}
    ws.model("c").wait, ws.model("c").target = "backing off", 1
    ws.model("c").clear_pass()
    c = ws.models["c"]
    assert (c.wait, c.backoff, c.target, c.unplaceable) == (None, None, None, None)
