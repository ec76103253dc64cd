"""The loops that retry wait what a transient error's `delay` says (bounded by the loop), and say an outage once.

Each loop is run for real against a controller on a SQLite store in tmp; what fails is a fake (a source, a pass)
raising the tree's transient errors, and the waits are recorded or made observable by a deadline."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from support import wait_for

from llmgw.adapters.sources import Checkout, SourceUnavailable
from llmgw.controller import admin
from llmgw.controller.app import SOURCE, _source_loop
from llmgw.controller.core import CONTROLLER, Controller
from llmgw.controller.metrics import ControllerMetrics
from llmgw.controller.reconcile_loop import PASS_RETRY_MAX_S, PASS_RETRY_S, Reconciler
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
