"""The router's link to the controller: a lost stream is retried after the delay its error gives (bounded by the
link's longest backoff), else after the link's own jittered backoff; the outage is said once."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from llmgw_router.fleet.link import ControllerLink, ControllerUnreachable


class Stop(Exception):
    """Ends the link's loop from inside its wait."""


class ScriptedLink(ControllerLink):
    """Each session raises the next error; the waits the loop asks for are recorded."""

    def __init__(self, errors: list[Exception]) -> None:
        super().__init__("ws://127.0.0.1:9/router/v1", "r1", None, lambda _: None, dict, max_backoff=10.0)
        self.errors = errors
        self.waits: list[float] = []

    async def _stream(self, session: aiohttp.ClientSession) -> None:
        raise self.errors.pop(0)

    async def _pause(self, seconds: float) -> None:
        self.waits.append(seconds)
        if not self.errors:
            raise Stop


async def test_a_lost_stream_is_retried_after_the_delay_its_error_gives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    link = ScriptedLink(
        [
            ControllerUnreachable("a standby: try again soon", delay=1.5),
            ControllerUnreachable("longer than the link ever waits", delay=3600.0),
            # A connection refused becomes ControllerUnreachable with no delay: the link's backoff, 0.8 s by
            # now, jittered.
            aiohttp.ClientConnectionError("refused"),
        ]
    )
    async with aiohttp.ClientSession() as session:
        with caplog.at_level(logging.INFO, logger="llmgw_router.fleet.link"), pytest.raises(Stop):
            await asyncio.wait_for(link.run(session), 10)
    assert link.waits[:2] == [1.5, 10.0]
    assert 0.4 <= link.waits[2] < 1.2
    said = [r.getMessage() for r in caplog.records if r.name == "llmgw_router.fleet.link"]
    assert said == [
        "the controller stream (serving the last snapshot meanwhile) failed, retrying in 1.5s until it works:"
        " a standby: try again soon"
    ]
