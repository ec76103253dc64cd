"""A controller cut from PostgreSQL in the middle of a lease transaction must not hold the lease's row lock
until the server's TCP gives up. The lease statement and a fenced write's check both lock the row until
COMMIT; a leader whose network went between the two left its session idle in the transaction, and the
standby's takeover waited on that lock (the likely cause of a host-lab run whose standby never led). The
server now ends such a transaction once its client has been silent for LEASE_LOCK_SILENCE_S.

Here the silence is made by holding the transaction open right after its lease statement, with the real
store code around it; the other controller's takeover, once the claim has expired, must go through."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

import llmgw.store.store as store_module
from llmgw.store import Fence, ReplicaRecord, Store, StoreUnavailable
from llmgw.store.db import Params, Tx

pytestmark = pytest.mark.postgres


class SilentAfterLeaseStatement:
    """A transaction whose client goes silent right after its statement on the leases table ran."""

    def __init__(self, tx: Tx, silent: asyncio.Event, never: asyncio.Event) -> None:
        self._tx, self._silent, self._never = tx, silent, never

    async def _then_silent(self, sql: str) -> None:
        if "leases" in sql and not sql.startswith("SELECT holder"):
            self._silent.set()
            await self._never.wait()

    async def fetch(self, sql: str, params: Params = ()) -> list[tuple[object, ...]]:
        rows = await self._tx.fetch(sql, params)
        await self._then_silent(sql)
        return rows

    async def execute(self, sql: str, params: Params = ()) -> int:
        count = await self._tx.execute(sql, params)
        await self._then_silent(sql)
        return count

    async def executemany(self, sql: str, rows: object) -> None:
        raise AssertionError("not on the lease's path")

    async def end_if_client_silent(self, seconds: float) -> None:
        await self._tx.end_if_client_silent(seconds)


def cut_after_lease_statement(
    store: Store, monkeypatch: pytest.MonkeyPatch, silent: asyncio.Event, never: asyncio.Event
) -> None:
    """From now on, each of `store`'s transactions goes silent right after its statement on the leases table
    (`silent` is set then), until `never` is set."""
    real_tx = store.db.tx

    @contextlib.asynccontextmanager
    async def cut_tx() -> AsyncIterator[Tx]:
        async with real_tx() as tx:
            yield SilentAfterLeaseStatement(tx, silent, never)

    monkeypatch.setattr(store.db, "tx", cut_tx)


@pytest.mark.parametrize("cut_during", ["renewal", "fenced write"])
async def test_a_leader_silent_inside_a_lease_transaction_does_not_block_the_takeover(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch, cut_during: str
) -> None:
    monkeypatch.setattr(store_module, "LEASE_LOCK_SILENCE_S", 1.0)
    leader, standby = await Store.open(pg_dsn), await Store.open(pg_dsn)
    silent, never = asyncio.Event(), asyncio.Event()
    try:
        held = (await leader.acquire_lease("leader", "ca", ttl=10.0, now=100.0)).current
        assert held is not None
        cut_after_lease_statement(leader, monkeypatch, silent, never)
        replica = ReplicaRecord("r1", "m", "sim", ("n1",), "starting", "fp", 1.0, 1.0)
        lease_statement: Coroutine[Any, Any, object] = (
            leader.acquire_lease("leader", "ca", ttl=10.0, now=101.0)
            if cut_during == "renewal"
            else leader.upsert_replica(replica, fence=Fence("leader", "ca", held.epoch))
        )
        cut = asyncio.create_task(lease_statement)
        await asyncio.wait_for(silent.wait(), 10)
        # The claim has run out (renewed to 111 at most); the standby takes it once the lock is free.
        taken = await asyncio.wait_for(standby.acquire_lease("leader", "cb", ttl=10.0, now=112.0), 15)
        assert taken.held and taken.current is not None
        assert (taken.current.holder, taken.current.epoch) == ("cb", held.epoch + 1)
        # The silent leader's transaction was ended by the server: when its client speaks again, it fails.
        never.set()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(cut, 10)
        assert "r1" not in {r.id for r in await standby.list_replicas()}
    finally:
        never.set()
        await leader.close()
        await standby.close()


async def test_under_a_short_lease_ttl_the_silent_leaders_lock_ends_before_its_claim(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's `lease_ttl` of 1.5 s: the silent leader's lock ends after 1 s (two thirds of it), not
    the default 10 s, so the standby takes the lease as soon as the claim has run out."""
    assert store_module.lease_lock_silence_s(None) == store_module.LEASE_LOCK_SILENCE_S
    assert store_module.lease_lock_silence_s(6.0) == 4.0
    leader, standby = await Store.open(pg_dsn), await Store.open(pg_dsn)
    silent, never = asyncio.Event(), asyncio.Event()
    try:
        held = (await leader.acquire_lease("leader", "ca", ttl=1.5, now=100.0)).current
        assert held is not None
        cut_after_lease_statement(leader, monkeypatch, silent, never)
        cut = asyncio.create_task(leader.acquire_lease("leader", "ca", ttl=1.5, now=101.0))
        await asyncio.wait_for(silent.wait(), 10)
        # The renewed claim runs to 102.5; with the default's 10 s the lock would outlast this wait.
        taken = await asyncio.wait_for(standby.acquire_lease("leader", "cb", ttl=1.5, now=103.0), 5)
        assert taken.held and taken.current is not None and taken.current.holder == "cb"
        never.set()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(cut, 10)
    finally:
        never.set()
        await leader.close()
        await standby.close()
