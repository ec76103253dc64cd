"""The scrape loop outlives a failed round: it logs it and scrapes again, like the router's other loops."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, fields

import aiohttp
import pytest
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.fleet.scrape import scrape_loop
from llmgw_router.fleet.table import LiveEndpoint, RoutingTable
from support import wait_for

from llmgw.core.snapshot import RouterSnapshot


@dataclass(frozen=True)
class _FailsOnce(RoutingTable):
    """A routing table whose first listing of endpoints fails, as a bug in a scrape round would."""

    calls: list[int] = field(default_factory=list, compare=False)  # listings since the loop started
    armed: list[bool] = field(default_factory=list, compare=False)

    def all_endpoints(self) -> list[LiveEndpoint]:
        if self.armed:
            self.calls.append(1)
            if len(self.calls) == 1:
                raise RuntimeError("a bug in the first round")
        return list(super().all_endpoints())


async def test_scrape_loop_logs_a_failed_round_and_keeps_scraping(caplog: pytest.LogCaptureFixture) -> None:
    snapshot = RouterSnapshot.model_validate({"revision": "r1", "router": {"scrape_interval": "1ms"}})
    built = RoutingTable.build(snapshot, {}, 0.0, {})
    given = [f.name for f in fields(built) if f.init and not f.name.startswith("_")]
    table = _FailsOnce(**{k: getattr(built, k) for k in given})
    metrics = RouterMetrics(lambda: None, lambda: 0.0)
    table.armed.append(True)
    rounds: list[int] = []
    async with aiohttp.ClientSession() as session:
        with caplog.at_level(logging.ERROR, logger="llmgw_router.fleet.scrape"):
            task = asyncio.create_task(
                scrape_loop(session, lambda: table, metrics, lambda: 0.0, lambda: rounds.append(1))
            )
            try:
                await wait_for(lambda: rounds, 10.0, "a scrape round after the failed one")
                assert not task.done()
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
    assert len(table.calls) >= 2
    assert any("scrape round failed" in r.getMessage() and r.exc_info for r in caplog.records)
