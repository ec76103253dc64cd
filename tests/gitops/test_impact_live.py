"""`llmgw plan`'s Impact against a live controller: the real controller in this process (SQLite in tmp) whose
store holds the recorded week of tests/plan/impact_fixture (written through the store's usage insert, as a
router's writer does, shifted to end an hour ago), and the CLI run with a `plan`-scoped token, as a pull
request's job holds. Then the same plan from the state it saved, as CI without cluster access runs it, from
an older state without the usage, and the PR gate (`--impact-exitcode`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from controller.helpers import Repo, settings_for, start
from plan.impact_fixture import NOW, WEEK, recorded_week, write_repo
from support import wait_for
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.store.queries.capacity import CapacityRecord

pytestmark = pytest.mark.integration

PLAN_TOKEN = "plan-token-for-pull-requests"
LOCAL_CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: impact-live}
spec:
  controller: {address: "127.0.0.1:7070"}
"""
GEMMA_LOSS = "removes gemma from project playground, which sent 12,400 requests to it in the last 8 days"


class Live:
    def __init__(self, tmp: Path, running: Any) -> None:
        self.tmp, self.running = tmp, running
        self.token = tmp / "plan-token"
        self.token.write_text(PLAN_TOKEN + "\n")
        self.proposed = _without_remote_node(write_repo(tmp / "proposed", applied=False))

    async def cli(self, *args: str) -> tuple[int, str, str]:
        result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
        return result.exit_code, result.stdout, result.stderr

    async def plan_live(self, *args: str) -> tuple[int, str, str]:
        where = ("--controller", self.running.url, "--token-file", str(self.token))
        return await self.cli("plan", str(self.proposed), *where, "--offline", *args)


def _without_remote_node(root: Path) -> Path:
    """The fixture's repo with no node to bootstrap: the controller needs none to answer a plan."""
    (root / "cluster.yaml").write_text(LOCAL_CLUSTER)
    return root


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    applied = Repo(tmp_path / "applied", use_git=False)
    write_repo(applied.path, applied=True)
    _without_remote_node(applied.path)
    tokens = tmp_path / "admin-tokens.yaml"
    tokens.write_text(
        f"ci-plan: {{scope: plan, sha256: {hashlib.sha256(PLAN_TOKEN.encode()).hexdigest()}}}\n"
    )
    running, admin = await start(settings_for(tmp_path, applied.path, admin_tokens_file=tokens))
    try:

        async def applied_revision() -> str | None:
            return ((await admin.get("/api/v1/status")).get("applied") or {}).get("revision")

        await wait_for(applied_revision, 30, "the controller applied the fixture's revision")
        store = running.controller.store
        # The week ends an hour ago (whole minutes, so its busiest minute stays one minute).
        shift = (int(time.time() - 3600 - NOW) // 60) * 60
        rows = [replace(r, time=r.time + shift) for r in recorded_week() if r.time >= NOW - WEEK]
        for i in range(0, len(rows), 2000):
            await store.insert_usage(rows[i : i + 2000])
        await store.save_capacity(
            CapacityRecord("sim-chat", "sim", "", "sim", NOW + shift, 500.0, 8, 400.0, None, None, 1.0)
        )
        yield Live(tmp_path, running)
    finally:
        await running.stop()


async def test_a_plan_token_gets_the_impact_and_the_gate_fails_on_a_loss(live: Live) -> None:
    code, out, err = await live.plan_live(
        "--usage-window", "8d", "--impact-exitcode", "--save-state", str(live.tmp / "s.json")
    )
    assert code == 3, out + err
    assert GEMMA_LOSS in out
    assert "lowers team research's tpm to 50k; its peak minute in the last 8 days" in out
    assert "peak concurrency in the last 8 days was 19 against a measured capacity of 8 per replica" in out
    # The store is younger than the window asked for: said once, in the headline. Its span is the week plus
    # the hour plus however long the test took, less the shift's rounding to a minute: 7d, or 7d 1h.
    assert out.count("records cover only the last 7d") == 1

    code, _, err = await live.plan_live("--usage-window", "8d")
    assert code == 0, err  # without the gate a loss is shown, not failed

    code, markdown, err = await live.plan_live("--usage-window", "8d", "--format", "markdown")
    assert code == 0, err
    short, _, full = markdown.partition("<details><summary>Impact in full")
    assert "#### Impact" in short and GEMMA_LOSS in short
    assert "sets project prod's rpm to 200" not in short and "sets project prod's rpm to 200" in full


async def test_a_saved_state_carries_the_usage_and_an_old_one_says_it_has_none(live: Live) -> None:
    state = live.tmp / "state.json"
    code, out_live, err = await live.plan_live("--usage-window", "8d", "--save-state", str(state))
    assert code == 0, err
    saved = json.loads(state.read_text())
    assert saved["usage"]["format"] == "llmgw-usage-summary/v1" and saved["usage"]["capacity"]

    code, out_saved, err = await live.cli(
        "plan", str(live.proposed), "--state", str(state), "--offline", "--impact-exitcode"
    )
    assert code == 3, err
    impact = [line for line in out_live.splitlines() if line.startswith(("Impact", "  !", "  ="))]
    assert impact and impact == [
        line for line in out_saved.splitlines() if line.startswith(("Impact", "  !", "  ="))
    ]

    del saved["usage"]
    state.write_text(json.dumps(saved))
    code, out_old, err = await live.cli(
        "plan", str(live.proposed), "--state", str(state), "--offline", "--impact-exitcode"
    )
    assert code == 0, err  # nothing is known to be lost: the gate does not guess
    assert "Impact: usage: not in this saved state (saved without a usage summary); no Impact." in out_old

    saved["usage"] = {"format": "llmgw-usage-summary/v1", "since": "yesterday"}
    state.write_text(json.dumps(saved))
    code, _, err = await live.cli("plan", str(live.proposed), "--state", str(state), "--offline")
    assert code == 1 and f"{state}: usage: not a usage summary: since:" in err


async def test_a_window_the_controller_refuses_is_an_error_that_says_why(live: Live) -> None:
    code, _, err = await live.plan_live("--usage-window", "100d")
    assert code == 1 and "at most 90d" in err
    code, _, err = await live.plan_live("--usage-window", "soon")
    assert code == 1 and "not a duration: 'soon'" in err
    code, out, err = await live.plan_live("--usage-window", "0")
    assert code == 0 and "Impact" not in out, err
