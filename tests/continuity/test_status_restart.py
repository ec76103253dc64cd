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

    def said(context: str) -> list[str]:
        """The states the forge was told, a status repeated back to back counted once."""
        states = on(context)
        return [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]

    await wait_for(lambda: on("llmgw/canary/m") == ["pending"] or None, 60, "the canary's pending posted")
    await cluster.stop_controller()
    await cluster.start_controller()
    await wait_for(lambda: said("llmgw/canary/m") == ["pending", "success"] or None, 90, "the verdict posted")
    await wait_for(lambda: said("llmgw/apply") == ["pending", "success"] or None, 60, "the apply healthy")
    # Once each; the one exception is the same status again when the controller stopped between the forge's
    # answer and the outbox row's delete (the forge shows it once): never a second canary's `pending`.
    assert said("llmgw/canary/m") == ["pending", "success"]
    assert on("llmgw/canary/m").count("success") == 1
    kinds = [e["kind"] for e in await cluster.events() if e["object"] == "m"]
    assert kinds.count("canary_started") == 1, kinds
