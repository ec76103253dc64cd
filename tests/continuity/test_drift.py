"""Drift healed with words (issue 39): an engine killed by hand is the fleet differing from the revision; the
controller replaces it and says, in a `drift` event, what differed (`llmgw plan` shows the same while it
lasts: tests/plan/test_plan.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from controller.fleet_ops import sim_model
from faults.cluster import Cluster
from support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()


async def test_an_engine_killed_by_hand_is_healed_with_an_event_saying_what_differed(
    cluster: Cluster,
) -> None:
    await cluster.bring_up(["n1"], {"models/m.yaml": sim_model("m", 1)})
    [before] = await cluster.wait_ready("m", 1)
    os.kill(before["pid"], signal.SIGKILL)

    async def healed() -> list[dict[str, Any]] | None:
        assert cluster.admin is not None
        ready = await cluster.admin.replicas("m", "ready")
        return ready if len(ready) == 1 and ready[0]["id"] != before["id"] else None

    await wait_for(healed, 60, "the killed replica replaced")
    drift = [e for e in await cluster.events() if e["kind"] == "drift"]
    assert [e["object"] for e in drift] == ["m"], drift
    words = drift[0]["message"]
    assert words.startswith(f"{before['id']} (m/sim) on n1 is not running (engine exited"), words
    assert words.endswith("the revision declares 1 replica(s) of m: replaced"), words
