"""The loops that retry wait what a transient error's `delay` says (bounded by the loop), and say an outage once.

Each loop is run for real against a controller on a SQLite store in tmp; what fails is a fake (a source, a pass)
raising the tree's transient errors, and the waits are recorded or made observable by a deadline."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from support import wait_for

from llmgw.adapters.commit_status import StatusPoster
from llmgw.adapters.sources import Checkout, SourceUnavailable
from llmgw.controller.api import admin
from llmgw.controller.app import SOURCE, _source_loop
from llmgw.controller.core import CONTROLLER, Controller
from llmgw.controller.loops import nodes as nodes_loop
from llmgw.controller.loops.commit_statuses import CommitStatuses
from llmgw.controller.loops.nodes import NodesLoop
from llmgw.controller.loops.notifier import IDLE_WAIT_S, Notifier
from llmgw.controller.loops.reconcile import PASS_RETRY_MAX_S, PASS_RETRY_S, Reconciler
from llmgw.controller.loops.retention import PassResult, Retention
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.core.errors import TransientError
from llmgw.store import StoreUnavailable
from llmgw.store.store import Store

from .fake_agents import FakeAgents
from .helpers import Repo, settings_for


class Stop(Exception):
    """Ends a loop under test from inside its wait."""


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    repo = Repo(tmp_path / "repo", use_git=False)
    settings = settings_for(tmp_path, repo.path)
    store = await Store.open(settings.store)
    c = Controller(
        settings, store, ControllerMetrics(), admin_token="admin", agents=FakeAgents(time.monotonic)
    )
    yield c
    await c.stop_background()
    await store.close()


class Script:
    """What a loop's work does on each call: raise the next error, or return the next value; and the waits
    the loop asks for, recorded (the last one ends the loop)."""

    def __init__(self, outcomes: list[BaseException | float]) -> None:
        self.outcomes = outcomes
        self.waits: list[float] = []

    def next(self) -> float:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        if not self.outcomes:
            raise Stop


class FailingPasses(Reconciler):
    """Each pass raises the next of `failures` (a float is a pass that worked and asks to wake then)."""

    def __init__(self, c: Controller, failures: list[BaseException | float]) -> None:
        super().__init__(c)
        self.failures = failures
        self.waits: list[float] = []

    async def pass_once(self) -> float:
        outcome = self.failures.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _wait_for_change(self, seconds: float) -> None:
        self.waits.append(seconds)
        if not self.failures:
            raise Stop


async def test_the_reconcile_loop_waits_the_delay_a_transient_error_gives(
    controller: Controller, caplog: pytest.LogCaptureFixture
) -> None:
    passes = FailingPasses(
        controller,
        [
            StoreUnavailable("store down", delay=4.0),
            TransientError("still down", delay=3600.0),  # longer than the loop ever waits
            StoreUnavailable("down, no delay said"),
            RuntimeError("a bug"),
            5.0,
        ],
    )
    with caplog.at_level(logging.INFO, logger="llmgw.controller.reconcile"), pytest.raises(Stop):
        await asyncio.wait_for(passes.run(), 10)
    assert passes.waits == [4.0, PASS_RETRY_MAX_S, PASS_RETRY_S, PASS_RETRY_S, 5.0]
    said = [r.getMessage() for r in caplog.records if r.name == "llmgw.controller.reconcile"]
    assert said == [
        "a reconcile pass failed, retrying in 4.0s until it works: store down",
        "a reconcile pass works again (after 4 failed attempt(s))",
    ]


class DownSource:
    """A repo source that is down `down` times, asking to be tried again at once, then serves `root`."""

    description = "fake source"
    interval_s = 3600.0  # were the delay not read, the second poll would come an hour later

    def __init__(self, root: Path, down: int) -> None:
        self.root = root
        self.down = down
        self.polls = 0

    async def poll(self) -> Checkout:
        self.polls += 1
        if self.polls <= self.down:
            raise SourceUnavailable(f"unreachable ({self.polls})", delay=0.0)
        return Checkout("rev-1", self.root, self.description)


async def test_the_source_loop_polls_again_after_the_delay_the_source_gives(
    controller: Controller, tmp_path: Path
) -> None:
    source = DownSource(tmp_path / "repo", down=3)
    app = web.Application()
    app[CONTROLLER] = controller
    app[SOURCE] = source
    app[admin.POLL_NOW] = asyncio.Event()
    task = asyncio.create_task(_source_loop(app))
    try:
        await wait_for(lambda: controller.polled, 10, "the source polled again after each of 3 failures")
        assert source.polls == 4 and controller.polled is not None and controller.polled.revision == "rev-1"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class ScriptedNotifier(Notifier):
    def __init__(self, c: Controller, script: Script) -> None:
        super().__init__(c)
        self.script = script

    async def deliver_due(self, session: aiohttp.ClientSession) -> float:
        return self.script.next()

    async def check_budgets(self) -> int:
        self.script.next()
        return 0

    async def _wait_for_wake(self, seconds: float) -> None:
        self.script.wait(seconds)

    async def _pause(self, seconds: float) -> None:
        self.script.wait(seconds)


async def test_the_notification_sender_waits_the_delay_the_store_gives(controller: Controller) -> None:
    script = Script([StoreUnavailable("down", delay=7.0), StoreUnavailable("down", delay=3600.0), 4.0])
    with pytest.raises(Stop):
        await asyncio.wait_for(ScriptedNotifier(controller, script).run(), 10)
    assert script.waits == [7.0, IDLE_WAIT_S, 4.0]


async def test_the_budget_check_waits_the_delay_the_store_gives(controller: Controller) -> None:
    every = controller.settings.budget_check_s
    script = Script([StoreUnavailable("down", delay=every / 4), StoreUnavailable("down"), 0.0])
    with pytest.raises(Stop):
        await asyncio.wait_for(ScriptedNotifier(controller, script).budget_loop(), 10)
    assert script.waits == [every / 4, every, every]


class ScriptedRetention(Retention):
    def __init__(self, c: Controller, script: Script) -> None:
        super().__init__(c)
        self.script = script

    async def prune_once(self) -> PassResult:
        self.script.next()
        return PassResult()

    async def _pause(self, seconds: float) -> None:
        self.script.wait(seconds)


async def test_pruning_waits_the_delay_the_store_gives(
    controller: Controller, caplog: pytest.LogCaptureFixture
) -> None:
    every = controller.settings.retention_check_s
    script = Script([StoreUnavailable("down", delay=every / 2), RuntimeError("a bug"), 0.0])
    with caplog.at_level(logging.INFO, logger="llmgw.controller.loops.retention"), pytest.raises(Stop):
        await asyncio.wait_for(ScriptedRetention(controller, script).run(), 10)
    assert script.waits == [every / 2, every, every]
    said = [r.getMessage() for r in caplog.records if r.name == "llmgw.controller.loops.retention"]
    assert said == [
        f"pruning usage and content failed, retrying in {every / 2:.1f}s until it works: down",
        "pruning usage and content works again (after 2 failed attempt(s))",
    ]


class ScriptedStatuses(CommitStatuses):
    def __init__(self, c: Controller, script: Script) -> None:
        super().__init__(c, StatusPoster("http://127.0.0.1:9/repos/o/r", "token"))
        self.script = script
        self.deliveries = 0

    async def deliver(self) -> None:
        self.deliveries += 1
        self.script.next()

    async def _healthy(self) -> None:
        return None

    async def _pause(self, seconds: float) -> None:
        self.script.wait(seconds)


async def test_commit_statuses_wait_the_delay_the_store_gives(controller: Controller) -> None:
    controller.worker_state.earlier_state_read = True
    script = Script([StoreUnavailable("down", delay=2.5), StoreUnavailable("down", delay=3600.0), 0.0])
    statuses = ScriptedStatuses(controller, script)
    with pytest.raises(Stop):
        await asyncio.wait_for(statuses.run(), 10)
    # What is owed is delivered again after each failure, then once only.
    assert script.waits == [2.5, CommitStatuses.RETRY_MAX_S, CommitStatuses.TICK_S]
    assert statuses.deliveries == 3


async def no_drain(node: str, why: str) -> int:
    return 0


class ScriptedNodes(NodesLoop):
    def __init__(self, c: Controller, script: Script) -> None:
        super().__init__(c, drain_node=no_drain)
        self.script = script

    async def pass_once(self) -> None:
        self.script.next()

    async def _wait_for_wake(self, seconds: float) -> None:
        self.script.wait(seconds)


async def test_the_nodes_loop_waits_the_delay_the_store_gives(controller: Controller) -> None:
    script = Script([StoreUnavailable("down", delay=12.0), RuntimeError("a bug"), 0.0])
    nodes = ScriptedNodes(controller, script)
    try:
        with pytest.raises(Stop):
            await asyncio.wait_for(nodes.run(), 10)
    finally:
        await nodes.close()
    assert script.waits == [12.0, nodes_loop.TICK_S, nodes_loop.TICK_S]
