"""The controller keeps the store bounded (real controller and store, fake agents): old usage rows become
per-minute aggregates, old aggregates and expired content go, a project that stops keeping content loses
it, and only the leader prunes. The snapshot routers get carries the salt of their prefix hashes."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import wait_for

from llmgw.controller.core import Controller
from llmgw.controller.loops.retention import Retention
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.parts.settings import ControllerOptions, load_settings_file
from llmgw.controller.wire.publisher import snapshot
from llmgw.core.tenancy.limits import window_bounds
from llmgw.core.traffic.recorded import trace_salt
from llmgw.store import UsageRecord
from llmgw.store.queries.content import ContentError
from llmgw.store.store import Store

from .fake_agents import FakeAgents
from .helpers import Repo, cluster_yaml, settings_for
from .test_reconcile_loop import Loop

DAY = 86400.0
TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: keeps}
spec:
  organization: acme
  retention: {content: true, ttl: 1h}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: plain}
spec: {organization: acme}
"""


@pytest.fixture
async def loop(tmp_path: Path) -> AsyncIterator[Loop]:
    repo = Repo(tmp_path / "repo", use_git=False)
    key_file = tmp_path / "content.key"
    key_file.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    settings = settings_for(
        tmp_path,
        repo.path,
        usage_retention_s=30 * DAY,
        usage_minutes_retention_s=90 * DAY,
        retention_batch=100,
        content_key_file=key_file,
        retention_check_s=0.05,
    )
    store = await Store.open(settings.store)
    agents = FakeAgents(clock=time.monotonic)
    controller = Controller(settings, store, ControllerMetrics(), admin_token="admin", agents=agents)
    lp = Loop(tmp_path, controller, agents, repo)
    lp.apply({"cluster.yaml": cluster_yaml(), "tenants.yaml": TENANTS})
    yield lp
    await lp.reconciler.close()
    await controller.stop_background()
    await store.close()


def _row(done: float, project: str = "keeps") -> UsageRecord:
    return UsageRecord(time=done, request_id="r", project=project, model="m", status=200, latency_ms=100.0)


async def test_a_pass_prunes_rows_aggregates_and_content(loop: Loop) -> None:
    c: Controller = loop.c
    now = c.wall()
    old = now - 40 * DAY
    await c.store.insert_usage([_row(old + i) for i in range(250)] + [_row(now - DAY)])
    await c.store.insert_usage([_row(now - 100 * DAY)])
    retention = Retention(c)
    assert retention.vault is not None
    await retention.vault.put("response", "keeps", "r1", b"kept", ttl_s=3600, now=now)
    await retention.vault.put("response", "keeps", "r0", b"old", ttl_s=3600, now=now - 2 * 3600)
    await retention.vault.put("response", "plain", "r2", b"not opted in", ttl_s=3600, now=now)

    done = await retention.prune_once()
    assert done.usage_rows == 251, "every old row, in batches of at most about 100"
    assert (done.content_expired, done.content_withdrawn) == (1, 1)
    left = await c.store.usage_page(0, now + 1)
    assert [r.time for r in left] == [now - DAY]
    minutes = await c.store.usage_minutes(0, now)
    assert sum(m.requests for m in minutes) == 250, "the 100-day-old minute is past usage_minutes_retention"
    kept = await retention.vault.get("response", "keeps", "r1", now)
    assert kept is not None and kept.data == b"kept"
    assert await retention.vault.get("response", "plain", "r2", now) is None


async def test_only_the_leader_prunes(loop: Loop) -> None:
    c = loop.c
    await c.store.insert_usage([_row(c.wall() - 40 * DAY)])
    retention = Retention(c)
    leading = False
    c.leading = lambda: leading  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(retention.run())
    try:
        await asyncio.sleep(0.2)
        assert retention.passes == 0 and len(await c.store.usage_page(0, c.wall())) == 1
        leading = True
        await wait_for(lambda: retention.passes > 0, 10, "a pass once leading")
        assert await c.store.usage_page(0, c.wall()) == []
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_bad_content_key_file_is_named(loop: Loop, tmp_path: Path) -> None:
    bad = tmp_path / "short.key"
    bad.write_text(base64.b64encode(b"x" * 8).decode())
    loop.c.settings = loop.c.settings.model_copy(update={"content_key_file": bad})
    with pytest.raises(ContentError, match=f"content_key_file {bad}: the content key is 8 bytes"):
        Retention(loop.c)


async def test_routers_are_told_the_salt_of_their_prefix_hashes(loop: Loop) -> None:
    snap = snapshot(loop.c)
    assert snap is not None
    assert snap.trace_salt == trace_salt(loop.c.cluster_secret().encode())
    assert snap.tenants.projects["keeps"].retention is not None, "routers see which projects keep content"


def test_retention_settings_read_durations(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        "repo: .\nstore: x\nusage-retention: 7d\nusage-minutes-retention: 1w\nretention-check: 1m\n"
    )
    settings = ControllerOptions(**load_settings_file(path))
    assert (settings.usage_retention_s, settings.usage_minutes_retention_s) == (7 * DAY, 7 * DAY)
    assert settings.retention_check_s == 60.0


BUDGETED = TENANTS.replace(
    "spec: {organization: acme}", "spec:\n  organization: acme\n  limits: {budget: {amount: 10, period: 30d}}"
)


async def test_rows_inside_a_budgets_window_are_kept_and_nothing_before_a_revision(loop: Loop) -> None:
    c = loop.c
    c.settings = c.settings.model_copy(update={"usage_retention_s": 1.0})
    now = c.wall()
    start, _ = window_bounds(now, 30 * DAY)
    await c.store.insert_usage([_row(start - 10, "plain"), _row(start + 1, "plain")])
    desired, c.desired = c.desired, None
    assert (await Retention(c).prune_once()).usage_rows == 0, "no revision: the budgets are not known"
    c.desired = desired
    loop.apply({"tenants.yaml": BUDGETED})
    done = await Retention(c).prune_once()
    assert done.usage_rows == 1
    assert [r.time for r in await c.store.usage_page(0, now + 1)] == [start + 1], "its spend still reads it"
