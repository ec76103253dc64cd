"""The leader lease: the pure decision, and the loop against a real store (SQLite and PostgreSQL), including
a PostgreSQL that is really stopped: the holder keeps its claim until its own expiry minus the margin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import wait_for

from llmgw.controller.parts.lease import (
    STANDBY_REFUSAL,
    LeaderLease,
    Leadership,
    LeaseConfig,
    decide,
    leader_address,
)
from llmgw.store import LeaseFenced, LeaseResult, LeaseRow, ReplicaRecord, Store

CFG = LeaseConfig(ttl_s=15.0, renew_s=3.0, margin_s=3.0)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def standby(holder: str = "me@a") -> Leadership:
    return Leadership(role="standby", holder=holder)


def test_taking_makes_leader_until_sent_at_plus_ttl_minus_margin() -> None:
    s = decide(
        standby(), now=101.0, cfg=CFG, result=LeaseResult(True, LeaseRow("l", "me@a", 115.0)), sent_at=100.0
    )
    assert s.leading and s.leader == "me@a" and s.valid_until == 100.0 + 15.0 - 3.0 and s.since == 101.0


def test_someone_else_holding_makes_standby_naming_them() -> None:
    leader = Leadership(role="leader", holder="me@a", leader="me@a", valid_until=200.0)
    s = decide(leader, now=150.0, cfg=CFG, result=LeaseResult(False, LeaseRow("l", "other@b", 160.0)))
    assert not s.leading and s.leader == "other@b" and s.since == 150.0


async def test_the_leader_fences_its_writes_with_the_epoch_it_won_and_stands_by_when_refused(
    tmp_path: Path,
) -> None:
    """Two leases on one store: b takes over from a whose claim ran out; a's fence (holder, epoch 1) is refused
    by the store, and a refused write makes a stand by at once, before its own loop would notice."""
    store = await Store.open(f"sqlite:///{tmp_path / 'lease.db'}")
    try:
        clock, wall = Clock(), Clock(5000.0)
        cfg = LeaseConfig(ttl_s=3.0, renew_s=0.5, margin_s=0.5)
        a = LeaderLease(store, "a", cfg, wall=wall, clock=clock)
        b = LeaderLease(store, "b", cfg, wall=wall, clock=clock)
        assert (await a.attempt()).leading and a.fence().epoch == 1
        assert a.fence().ttl_s == 3.0  # the store bounds a silent client's lock by it
        assert not (await b.attempt()).leading
        wall.t += 3.0  # a's claim ran out in the store (a, partitioned, has not looked yet)
        assert (await b.attempt()).leading and b.fence().epoch == 2
        assert a.leading(), "a's own validity has not ended on its clock: only the store can stop it now"
        with pytest.raises(LeaseFenced, match=r"not by .*a at epoch 1"):
            await store.upsert_replica(ReplicaRecord("r", "m", "p", ("n",), "x", "f", 1, 1), fence=a.fence())
        a.deposed("the store refused a write")
        assert not a.leading() and a.status()["epoch"] is None and b.status()["epoch"] == 2
    finally:
        await store.close()


def test_store_error_keeps_a_valid_claim_then_steps_down() -> None:
    leader = Leadership(role="leader", holder="me@a", leader="me@a", valid_until=112.0)
    kept = decide(leader, now=111.9, cfg=CFG, error="connection refused")
    assert kept.leading and kept.error == "connection refused"
    gone = decide(kept, now=112.0, cfg=CFG, error="connection refused")
    assert not gone.leading and gone.leader is None and gone.error == "connection refused"
    # A standby never becomes leader from an error.
    assert not decide(standby(), now=1.0, cfg=CFG, error="x").leading


def test_a_tick_past_validity_steps_down() -> None:
    leader = Leadership(role="leader", holder="me@a", leader="me@a", valid_until=112.0)
    assert decide(leader, now=111.0, cfg=CFG).leading
    assert not decide(leader, now=112.5, cfg=CFG).leading


def test_timings_that_cannot_renew_in_time_are_refused() -> None:
    with pytest.raises(ValueError, match="renew"):
        LeaseConfig(ttl_s=5.0, renew_s=3.0, margin_s=3.0)


def test_leader_address_from_holder() -> None:
    assert leader_address("abc@http://10.0.0.1:7070") == "http://10.0.0.1:7070"
    assert leader_address(None) is None and leader_address("nohost") is None


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    dsn = f"sqlite:///{tmp_path / 'l.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_dsn")
    opened = await Store.open(dsn)
    yield opened
    await opened.close()


async def test_two_controllers_one_leader_and_takeover_after_expiry(store: Store) -> None:
    wall, mono = Clock(5000.0), Clock(10.0)
    changes: list[tuple[str, str]] = []
    a = LeaderLease(
        store,
        "http://a:7070",
        CFG,
        wall=wall,
        clock=mono,
        on_lead=lambda n: changes.append(("a", f"lead as {n.role}")),
        on_step_down=lambda n: changes.append(("a", f"step down to {n.role}")),
    )
    b = LeaderLease(store, "http://b:7070", CFG, wall=wall, clock=mono)
    assert a.holder != b.holder and a.holder.endswith("@http://a:7070")
    # Before the store has answered, neither leads and neither can say who does.
    assert [x.status()["role"] for x in (a, b)] == ["starting", "starting"]
    assert b.status()["leader_address"] is None
    await a.attempt()
    assert b.status()["role"] == "starting"
    await b.attempt()
    assert b.status()["role"] == "standby"
    assert a.leading() and not b.leading()
    assert b.state.leader == a.holder
    assert b.refusal() == f"{STANDBY_REFUSAL} (the leader is http://a:7070)"
    assert a.refusal() is None
    assert a.status()["role"] == "leader" and b.status()["leader_address"] == "http://a:7070"
    # a renews while b keeps trying: still one leader.
    for _ in range(3):
        wall.t += 3.0
        mono.t += 3.0
        await a.attempt()
        await b.attempt()
        assert a.leading() and not b.leading()
    # a dies (stops renewing): b takes over once the stored claim has expired, not before.
    wall.t += 14.9
    mono.t += 14.9
    await b.attempt()
    assert not b.leading()
    wall.t += 0.2
    mono.t += 0.2
    await b.attempt()
    assert b.leading()
    # a, if it wakes up, already stepped down on its own clock and then learns who leads.
    a.tick()
    assert not a.leading()
    await a.attempt()
    assert not a.leading() and a.state.leader == b.holder
    assert changes == [("a", "lead as leader"), ("a", "step down to standby")]


async def test_a_restarted_controller_does_not_inherit_its_old_claim(store: Store) -> None:
    wall, mono = Clock(5000.0), Clock(10.0)
    first = LeaderLease(store, "http://a:7070", CFG, wall=wall, clock=mono)
    await first.attempt()
    assert first.leading()
    again = LeaderLease(store, "http://a:7070", CFG, wall=wall, clock=mono)  # same address, new process
    await again.attempt()
    assert not again.leading()


async def test_release_lets_a_standby_lead_at_once(store: Store) -> None:
    wall, mono = Clock(5000.0), Clock(10.0)
    a = LeaderLease(store, "http://a:7070", CFG, wall=wall, clock=mono)
    b = LeaderLease(store, "http://b:7070", CFG, wall=wall, clock=mono)
    await a.attempt()
    await a.release()
    assert not a.leading()
    await b.attempt()
    assert b.leading()


@pytest.mark.postgres
@pytest.mark.integration
async def test_postgres_stopped_the_leader_keeps_its_claim_then_steps_down(pg_server, pg_dsn: str) -> None:  # type: ignore[no-untyped-def]
    """A real outage: the claim survives store errors for ttl - margin from the last renewal, then goes."""
    if not pg_server.controllable:
        pytest.skip("external PostgreSQL: cannot stop it")
    store = await Store.open(pg_dsn)
    mono = Clock(10.0)
    lease = LeaderLease(store, "http://a:7070", CFG, clock=mono)
    try:
        await lease.attempt()
        assert lease.leading()
        await asyncio.to_thread(pg_server.stop)
        try:
            mono.t += 6.0
            await lease.attempt()
            assert lease.leading(), "an unreachable store is no evidence someone else leads"
            assert lease.state.error is not None and lease.failures == 1
            assert lease.status()["store_error"]
            mono.t += 6.0  # 12 s after the last renewal: past ttl - margin
            await lease.attempt()
            assert not lease.leading() and lease.state.leader is None
        finally:
            await asyncio.to_thread(pg_server.start)
        # The store is back: the same process takes the lease again (it expired, or is still its own).
        mono.t += 1.0
        await lease.attempt()
        assert lease.leading() and lease.state.error is None
    finally:
        await store.close()


async def test_run_loop_renews_and_steps_down_when_the_store_fails(tmp_path: Path) -> None:
    """The loop with real time and short timings: leads, then a store that raises makes it step down."""
    store = await Store.open(f"sqlite:///{tmp_path / 'l.db'}")
    cfg = LeaseConfig(ttl_s=1.0, renew_s=0.1, margin_s=0.2)
    roles: list[str] = []
    lease = LeaderLease(
        store,
        "http://a:7070",
        cfg,
        on_lead=lambda n: roles.append(n.role),
        on_step_down=lambda n: roles.append(n.role),
    )
    task = asyncio.create_task(lease.run())
    try:
        await wait_for(lease.leading, 10.0, "the loop to take the lease")

        async def broken(*_: object) -> LeaseResult:
            raise ConnectionError("store down")

        store.acquire_lease = broken  # type: ignore[method-assign]
        # leading() turns false by the clock as the claim expires; the loop steps down (on_step_down) at its
        # next wake-up after that: wait for the step-down itself, not the first moment the claim is stale.
        await wait_for(lambda: len(roles) == 2, 10.0, "the loop to step down")
        assert roles == ["leader", "standby"]
        assert not lease.leading()
        assert lease.state.error == "store down"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.close()


async def test_a_cancelled_lease_loop_stops_even_when_its_renewal_has_just_finished(tmp_path: Path) -> None:
    """The stop arrives in the very step in which the store answered: the loop must still end (Python 3.11's
    `asyncio.wait_for` returned the answer instead and the loop ran on, so its owner waited forever)."""
    store = await Store.open(f"sqlite:///{tmp_path / 'l.db'}")
    lease = LeaderLease(store, "http://a:7070", LeaseConfig(ttl_s=1.0, renew_s=0.1, margin_s=0.2))
    real = store.acquire_lease

    async def answer_then_stop(name: str, holder: str, ttl: float, now: float) -> LeaseResult:
        result = await real(name, holder, ttl, now)
        task.cancel()  # the owner stops the loop just as the renewal completes
        return result

    store.acquire_lease = answer_then_stop  # type: ignore[method-assign]
    task = asyncio.create_task(lease.run())
    try:
        await asyncio.wait({task}, timeout=10.0)
        assert task.cancelled(), f"the lease loop outlived its cancellation ({lease.attempts} attempts)"
        assert lease.attempts == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()


async def test_a_store_that_does_not_answer_in_time_is_named_so_not_as_a_bare_timeout(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'l.db'}")
    lease = LeaderLease(store, "http://a:7070", LeaseConfig(ttl_s=1.0, renew_s=0.05, margin_s=0.2))

    async def silent(*_: object) -> LeaseResult:
        await asyncio.Event().wait()  # a store cut mid-call: no answer, no error
        raise AssertionError("unreachable")

    store.acquire_lease = silent  # type: ignore[method-assign]
    try:
        await lease.attempt()
        assert lease.state.error == "no answer within 0.05 s"  # was "TimeoutError"
    finally:
        await store.close()
