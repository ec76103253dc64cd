"""A stop (SIGTERM cancels the agent's main task) is never lost, also when it lands while a controller
connection is ending: an agent that swallowed it kept running from a removed node's deleted files, its
supervise loop waiting on it (issue 34)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from llmgw_agent.config import AgentConfig
from llmgw_agent.daemon import Agent


class _Closed:
    type = aiohttp.WSMsgType.CLOSED


class _ClosingSocket:
    """A controller connection that ends after one turn of the loop (the controller went away)."""

    def __aiter__(self) -> _ClosingSocket:
        return self

    async def __anext__(self) -> _Closed:
        await asyncio.sleep(0)
        return _Closed()


async def test_a_stop_landing_while_the_connection_ends_stops_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(AgentConfig(controllers=["127.0.0.1:9"], state_dir=str(tmp_path)))
    ending, release = asyncio.Event(), asyncio.Event()

    async def slow_to_end(*_: Any) -> None:
        # A sender that takes a while to wind down once cancelled (a frame in flight).
        try:
            await asyncio.Event().wait()
        finally:
            ending.set()
            await release.wait()

    monkeypatch.setattr(agent, "_heartbeats", slow_to_end)
    monkeypatch.setattr(agent, "_forward_updates", slow_to_end)
    serving = asyncio.create_task(agent._serve(_ClosingSocket(), 1.0))  # type: ignore[arg-type]
    await asyncio.wait_for(ending.wait(), 10)  # the connection ended; its senders are winding down
    serving.cancel()  # what SIGTERM does (daemon._main)
    release.set()
    await asyncio.wait([serving], timeout=10)
    assert serving.cancelled(), "the stop was lost: the agent would go on running"
