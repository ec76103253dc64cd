"""Fixtures the agent tests share: a fake controller to register with, and the agent processes a test starts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from .fake_controller import FakeController
from .test_daemon import AgentProcs


@pytest.fixture
async def ctl() -> AsyncIterator[FakeController]:
    controller = FakeController(token="agent-token")
    await controller.start()
    yield controller
    await controller.stop()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[AgentProcs]:
    procs = AgentProcs(tmp_path)
    yield procs
    procs.cleanup()
