"""Commit statuses across a controller restart (issue 39): a canary begun before the restart is the same canary
after it, so the forge is told `pending` once and the verdict once; the apply's status goes from `pending` to
`success` only when the fleet runs the revision."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from controller.fleet_ops import bring_up, sim_model
from controller.test_canary_commit_status import ROLLOUT, TOKEN, Forge, forge  # noqa: F401  (the fixture)
from faults.cluster import Cluster
from support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(tmp_path: Path, forge: Forge) -> AsyncIterator[Cluster]:  # noqa: F811
    (tmp_path / "forge-token").write_text(TOKEN + "\n")
    c = Cluster(tmp_path, commit_status_url=forge.base, commit_status_token_file=tmp_path / "forge-token")
    try:
        yield c
    finally:
        await c.close()


async def test_a_restart_mid_canary_posts_each_status_once(cluster: Cluster, forge: Forge) -> None:  # noqa: F811
    slow = ROLLOUT.replace("duration: 1s", "duration: 4s")
    await bring_up(cluster, ["n1"], {"models/m.yaml": sim_model("m", 1, extra=slow)})
    await cluster.wait_ready("m", 1)
    tried = cluster.repo.write(
        {"models/m.yaml": sim_model("m", 1, extra=slow, args="decode_ms_per_token: 3")}, "try"
    )

    def on(context: str) -> list[str]:
        return [
            g["body"]["state"]
            for g in forge.posted()
            if g["path"].endswith(f"/statuses/{tried}") and g["body"]["context"] == context
        ]

    await wait_for(lambda: on("llmgw/canary/m") == ["pending"] or None, 60, "the canary's pending posted")
    await cluster.stop_controller()
    await cluster.start_controller()
    await wait_for(lambda: on("llmgw/canary/m") == ["pending", "success"] or None, 90, "the verdict posted")
    await wait_for(lambda: on("llmgw/apply") == ["pending", "success"] or None, 60, "the apply healthy")
    assert on("llmgw/canary/m") == ["pending", "success"], "a status was posted twice"
    kinds = [e["kind"] for e in await cluster.events() if e["object"] == "m"]
    assert kinds.count("canary_started") == 1, kinds
