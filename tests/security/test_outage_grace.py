"""L2: a router restarted during a store outage takes no second grace share of a limit's window.

The outage rule allows each router one grace share per limit per window. Kept only in memory, every restart
of the router process during the outage allowed another; the grace ledger keeps it per router id on disk.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.core.tenancy.limits import Estimate, LevelLimits, Tenant
from llmgw.store import Store
from llmgw.store.limits.grace_ledger import GraceLedger
from llmgw.store.limits.limiter import PoolAdmission, PoolLimiter, SharePolicy

T0 = 1_200_000.0  # the start of a minute window


def _chain() -> tuple[Tenant, ...]:
    return (
        Tenant("organization", "acme"),
        Tenant("team", "research"),
        Tenant("project", "playground", LevelLimits(rpm=100)),
    )


async def _served(limiter: PoolLimiter, n: int) -> int:
    return sum([isinstance(await limiter.admit(_chain(), Estimate(1)), PoolAdmission) for _ in range(n)])


@pytest.mark.postgres
async def test_l2_router_restarted_during_an_outage_takes_no_second_grace_share(  # type: ignore[no-untyped-def]
    pg_server, pg_dsn, tmp_path: Path
) -> None:
    if not pg_server.controllable:
        pytest.skip("an external PostgreSQL (LLMGW_TEST_PG_DSN) is not ours to stop")
    store = await Store.open(pg_dsn)
    now = [T0]
    ledger_path = tmp_path / "grace" / "router-1.jsonl"

    def router() -> PoolLimiter:  # one router process, started again on the same state dir
        return PoolLimiter(
            store,
            clock=lambda: now[0],
            policy=SharePolicy(fraction=0.1),
            retry_interval=1.0,
            grace_ledger=GraceLedger(ledger_path),
        )

    try:
        first = router()
        assert await _served(first, 1) == 1  # holds a share of 10, spent 1
        await asyncio.to_thread(pg_server.stop)
        try:
            assert await _served(first, 30) == 9 + 10  # the held share, then its one grace share
            restarted = router()  # the process died (its held share with it) and came back, store still down
            assert await _served(restarted, 30) == 0  # this window's grace share was already taken
            now[0] += 60  # the next window: one grace share again, once
            assert await _served(restarted, 30) == 10
            assert await _served(router(), 30) == 0
        finally:
            await asyncio.to_thread(pg_server.start)
    finally:
        await store.close()


def test_l2_ledger_forgets_ended_windows_and_skips_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    ledger = GraceLedger(path)
    assert ledger.take("project:p:requests", T0, T0 + 60, T0)
    assert not ledger.take("project:p:requests", T0, T0 + 60, T0 + 1)
    with path.open("a") as fh:
        fh.write('{"key": "project:p:tok')  # a crash mid-line: that share was never used
    again = GraceLedger(path)
    assert not again.take("project:p:requests", T0, T0 + 60, T0 + 2)
    later = GraceLedger(path)
    assert later.take("project:p:requests", T0 + 60, T0 + 120, T0 + 61)
    assert len(path.read_text().splitlines()) == 1  # the ended window was dropped when read back
