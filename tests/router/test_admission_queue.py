"""The admission queue itself (llmgw_router.routing.admission) without sockets: shares and bands decide who gets a freed
slot, bounds per model and in total, displacement by a higher band, deadlines, and a waiter whose client
went away leaving at once. Each test decides when room appears and waits on conditions with deadlines."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from llmgw_router.decisions.fairqueue import band_of
from llmgw_router.routing.admission import Admission
from llmgw_router.server.errors import ApiError
from support import wait_for

DEADLINE_S = 5.0


class Room:
    def __init__(self) -> None:
        self.free = 0
        self.admitted: list[str] = []

    def has_room(self) -> bool:
        if self.free > 0:
            self.free -= 1
            return True
        return False

    async def wait(self, adm: Admission, name: str, model: str = "m", **place: object) -> None:
        await adm.wait(model, self.has_room, 60, **place)  # type: ignore[arg-type]
        self.admitted.append(name)


async def _quiet(adm: Admission) -> None:
    await wait_for(lambda: adm.wake_ups_pending == 0, DEADLINE_S, "every waiter parked")


async def _release_one_at_a_time(adm: Admission, room: Room, count: int) -> None:
    for n in range(count):
        room.free = 1
        adm.notify("m")
        await wait_for(lambda n=n: len(room.admitted) == n + 1, DEADLINE_S, f"admission {n + 1}")  # type: ignore[misc]
        await _quiet(adm)


async def test_freed_slots_go_to_projects_in_proportion_to_their_shares() -> None:
    adm = Admission(100)
    room = Room()
    tasks = [
        asyncio.create_task(room.wait(adm, f"{p}{i}", project=p, share=s))
        for i in range(20)
        for p, s in (("small", 1.0), ("large", 3.0))
    ]
    await wait_for(lambda: adm.queued("m") == 40, DEADLINE_S, "40 queued")
    await _release_one_at_a_time(adm, room, 20)
    large = sum(1 for n in room.admitted if n.startswith("large"))
    assert (large, 20 - large) == (15, 5)
    # FIFO within each project.
    smalls = [int(n[5:]) for n in room.admitted if n.startswith("small")]
    assert smalls == sorted(smalls)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert adm.depth == 0 and adm.queued("m") == 0


async def test_a_higher_band_goes_first_whatever_its_arrival_and_share() -> None:
    adm = Admission(100)
    room = Room()
    low = [asyncio.create_task(room.wait(adm, f"low{i}", project="bulk", share=100.0)) for i in range(3)]
    await wait_for(lambda: adm.queued("m") == 3, DEADLINE_S, "3 low queued")
    high = asyncio.create_task(room.wait(adm, "high", project="vip", band=band_of(None, 5)))
    await wait_for(lambda: adm.queued("m") == 4, DEADLINE_S, "the high one queued")
    await _release_one_at_a_time(adm, room, 4)
    assert room.admitted == ["high", "low0", "low1", "low2"]
    await asyncio.gather(high, *low)


async def test_bounds_per_model_and_in_total() -> None:
    rejected: list[str] = []
    adm = Admission(3, on_reject=rejected.append, model_queue_size=2)
    room = Room()
    a = [asyncio.create_task(room.wait(adm, f"a{i}", model="ma")) for i in range(2)]
    await wait_for(lambda: adm.queued("ma") == 2, DEADLINE_S, "ma's two")
    with pytest.raises(ApiError) as model_full:
        await adm.wait("ma", room.has_room, 60)
    assert model_full.value.status == 429 and model_full.value.code == "queue_full"
    assert "'ma' (2)" in model_full.value.message and model_full.value.headers["Retry-After"] == "1"
    b = asyncio.create_task(room.wait(adm, "b0", model="mb"))  # another model still has room in the total
    await wait_for(lambda: adm.depth == 3, DEADLINE_S, "three in all")
    with pytest.raises(ApiError) as total_full:
        await adm.wait("mc", room.has_room, 60)
    assert total_full.value.code == "queue_full" and "(3)" in total_full.value.message
    assert rejected == ["queue_full", "queue_full"]
    for t in (*a, b):
        t.cancel()
    await asyncio.gather(*a, b, return_exceptions=True)
    assert adm.depth == 0


async def test_a_full_queue_displaces_the_newest_of_a_lower_band_never_an_equal_one() -> None:
    adm = Admission(2)
    room = Room()
    old = asyncio.create_task(room.wait(adm, "old", band=band_of(2, 0)))
    await wait_for(lambda: adm.depth == 1, DEADLINE_S, "old queued")
    new = asyncio.create_task(room.wait(adm, "new", band=band_of(2, 0)))
    await wait_for(lambda: adm.depth == 2, DEADLINE_S, "new queued")
    with pytest.raises(ApiError) as equal:  # the same band: the newcomer is the one refused
        await adm.wait("m", room.has_room, 60, band=band_of(2, 0))
    assert equal.value.code == "queue_full"
    high = asyncio.create_task(room.wait(adm, "high", band=band_of(0, 0)))
    with pytest.raises(ApiError) as displaced:
        await new
    assert displaced.value.code == "queue_full" and "higher priority" in displaced.value.message
    await wait_for(lambda: adm.depth == 2, DEADLINE_S, "high in new's place")
    await _release_one_at_a_time(adm, room, 2)
    assert room.admitted == ["high", "old"]
    await asyncio.gather(old, high)
    assert adm.depth == 0


async def test_a_wait_past_its_deadline_is_what_expired_says_else_queue_timeout() -> None:
    rejected: list[str] = []
    adm = Admission(10, on_reject=rejected.append)
    loading = ApiError(503, "model is loading", "model_loading", "server_error", headers={"Retry-After": "7"})
    with pytest.raises(ApiError) as held:
        await adm.wait("m", lambda: False, 0.05, expired=lambda: loading)
    assert held.value is loading
    with pytest.raises(ApiError) as late:
        await adm.wait("m", lambda: False, 0.05, expired=lambda: None)
    assert late.value.status == 429 and late.value.code == "queue_timeout"
    assert int(late.value.headers["Retry-After"]) >= 1
    assert rejected == ["loading", "timeout"] and adm.depth == 0 and adm.queued("m") == 0


async def test_a_cancelled_waiter_leaves_at_once_and_takes_no_slot() -> None:
    # The router cancels a request's handler when its client goes away: its place must go with it at once,
    # not at its deadline, and the next slot must go to someone still there.
    adm = Admission(10)
    room = Room()
    gone = asyncio.create_task(room.wait(adm, "gone", project="p"))
    stays = asyncio.create_task(room.wait(adm, "stays", project="p"))
    await wait_for(lambda: adm.queued("m") == 2, DEADLINE_S, "two queued")
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert adm.queued("m") == 1 and adm.depth == 1  # before any slot frees or deadline passes
    await _release_one_at_a_time(adm, room, 1)
    await stays
    assert room.admitted == ["stays"] and adm.depth == 0 and adm.queued("m") == 0


def test_validate_names_a_bad_priority_or_share_with_its_place_and_range(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmgw.cli.main import app

    example = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"
    for part in ("cluster.yaml", "nodes", "policies"):
        src = example / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / part)
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "t.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Organization\nmetadata: {name: acme}\nspec: {}\n---\n"
        "apiVersion: llmgw/v1\nkind: Project\nmetadata: {name: p}\n"
        "spec:\n  organization: acme\n  priority: 5000\n  share: 0\n"
    )
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1, result.output
    where = tmp_path / "tenants" / "t.yaml"
    assert f"{where}:11:13: spec.priority: 5000 is out of range: must be at most 1000" in result.output
    assert f"{where}:12:10: spec.share: 0 is out of range: must be more than 0" in result.output
