"""Who goes next for one model (llmgw_router.decisions.fairqueue, pure): bands strictly ordered, fair shares over
projects, FIFO within a project. Property tests over arbitrary arrivals, departures and services."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings, strategies as st
from llmgw_router.decisions.fairqueue import UNRANKED, Entry, FairQueue, band_of

PROJECTS = ("a", "b", "c")


@dataclass(frozen=True)
class Arrive:
    project: str
    band: int
    count: int = 1  # a burst: backlogs are where fairness shows


@dataclass(frozen=True)
class Serve:
    pass


@dataclass(frozen=True)
class Leave:
    pick: int  # which waiting entry leaves unserved (its deadline, its client gone), modulo the count


ops = st.lists(
    st.one_of(
        st.builds(Arrive, st.sampled_from(PROJECTS), st.integers(0, 2), st.integers(1, 6)),
        st.just(Serve()),
        st.builds(Leave, st.integers(0, 1000)),
    ),
    max_size=300,
)
shares = st.fixed_dictionaries({p: st.sampled_from([0.5, 1.0, 2.0, 3.0, 7.5]) for p in PROJECTS})


def _run(
    queue: FairQueue[int], steps: list[Arrive | Serve | Leave], share: dict[str, float]
) -> list[Entry[int]]:
    served: list[Entry[int]] = []
    for n, op in enumerate(steps):
        if isinstance(op, Arrive):
            for _ in range(op.count):
                queue.push(n, op.project, (op.band, 0), share[op.project])
        elif isinstance(op, Leave) and len(queue):
            waiting = list(queue)
            queue.remove(waiting[op.pick % len(waiting)])
        elif isinstance(op, Serve) and len(queue):
            entry = queue.first()
            assert entry is not None
            # Bands are strict: nothing of a lower band is served while a higher band waits.
            assert entry.band == min(e.band for e in queue)
            queue.served(entry)
            served.append(entry)
    return served


@settings(max_examples=300, deadline=None)
@given(ops, shares)
def test_fifo_within_a_project_and_band(steps: list[Arrive | Serve | Leave], share: dict[str, float]) -> None:
    served = _run(FairQueue(), steps, share)
    for project in PROJECTS:
        for band in range(3):
            seqs = [e.seq for e in served if e.project == project and e.band == (band, 0)]
            assert seqs == sorted(seqs)


@settings(max_examples=300, deadline=None)
@given(ops, shares)
def test_bands_strictly_ordered(steps: list[Arrive | Serve | Leave], share: dict[str, float]) -> None:
    _run(FairQueue(), steps, share)  # the assertion is inside, at every service


@settings(max_examples=300, deadline=None)
@given(ops, shares)
def test_a_project_under_its_share_is_never_starved_by_one_over_it(
    steps: list[Arrive | Serve | Leave], share: dict[str, float]
) -> None:
    """Over every stretch in which two projects of one band both wait, what each got, divided by its share,
    differs by at most 1/share_a + 1/share_b (start-time fair queuing's bound): the one under its share goes
    next rather than the one over it, however their requests came and went."""
    steps = [Arrive(op.project, 0, op.count) if isinstance(op, Arrive) else op for op in steps]  # one band
    queue: FairQueue[int] = FairQueue()
    got: dict[tuple[str, str], dict[str, int]] = {}  # per pair both waiting: served since it began

    def waiting(p: str) -> bool:
        return any(e.project == p for e in queue)

    for n, op in enumerate(steps):
        if isinstance(op, Arrive):
            for _ in range(op.count):
                queue.push(n, op.project, (0, 0), share[op.project])
        elif isinstance(op, Leave) and len(queue):
            waiting_now = list(queue)
            queue.remove(waiting_now[op.pick % len(waiting_now)])
        elif isinstance(op, Serve) and len(queue):
            entry = queue.first()
            assert entry is not None
            queue.served(entry)
            for counts in got.values():
                if entry.project in counts:
                    counts[entry.project] += 1
        for a, b in ((a, b) for a in PROJECTS for b in PROJECTS if a < b):
            if waiting(a) and waiting(b):
                counts = got.setdefault((a, b), {a: 0, b: 0})
                bound = 1 / share[a] + 1 / share[b]
                assert abs(counts[a] / share[a] - counts[b] / share[b]) <= bound + 1e-9, (a, b, counts)
            else:
                got.pop((a, b), None)


def test_shares_split_a_long_backlog_in_proportion() -> None:
    queue: FairQueue[int] = FairQueue()
    for i in range(400):
        queue.push(i, "small", (0, 0), 1.0)
        queue.push(i, "large", (0, 0), 3.0)
    served = []
    for _ in range(200):
        entry = queue.first()
        assert entry is not None
        queue.served(entry)
        served.append(entry.project)
    assert served.count("large") == 150 and served.count("small") == 50


@pytest.mark.parametrize("batch", [2, 3, 4])
def test_shares_hold_when_several_slots_free_at_once(batch: int) -> None:
    # Slots freed together hand out `batch` wake-ups before any is used: each pick must count the ones
    # already promised, or the project at the head takes the whole batch (shares of 1:3 served as 1:2).
    queue: FairQueue[int] = FairQueue()
    for i in range(400):
        queue.push(i, "small", (0, 0), 1.0)
        queue.push(i, "large", (0, 0), 3.0)
    served: list[str] = []
    while len(served) < 240:
        promised: list[Entry[int]] = []

        def is_promised(e: Entry[int], batch_so_far: list[Entry[int]] = promised) -> bool:
            return e in batch_so_far

        for _ in range(batch):
            entry = queue.first(promised=is_promised)
            assert entry is not None
            promised.append(entry)
        for entry in promised:
            queue.served(entry)
            served.append(entry.project)
    assert served.count("small") == 60, served.count("small")


def test_an_idle_project_banks_no_credit() -> None:
    # `b` waited for nothing while `a` was served alone: on arrival it starts at the queue's virtual time,
    # so it does not get a long run of its own to catch up.
    queue: FairQueue[int] = FairQueue()
    for i in range(50):
        queue.push(i, "a", (0, 0), 1.0)
    for _ in range(40):
        entry = queue.first()
        assert entry is not None
        queue.served(entry)
    for i in range(10):
        queue.push(i, "b", (0, 0), 1.0)
    order = []
    for _ in range(10):
        entry = queue.first()
        assert entry is not None
        queue.served(entry)
        order.append(entry.project)
    assert order.count("a") == 5 and order.count("b") == 5


def test_skipped_entries_keep_their_places() -> None:
    queue: FairQueue[str] = FairQueue()
    x = queue.push("x", "p", (0, 0), 1.0)
    y = queue.push("y", "p", (0, 0), 1.0)
    z = queue.push("z", "q", (0, 0), 1.0)
    assert queue.first() is x
    assert queue.first(lambda e: e is x) in (y, z)
    assert queue.first(lambda e: e in (x, y, z)) is None
    assert queue.first() is x


def test_band_of_puts_the_class_before_the_project_priority() -> None:
    assert band_of(0, -5) < band_of(1, 100)  # a critical model's request before a batch one's, whoever asks
    assert band_of(1, 10) < band_of(1, 0)  # within a class, the higher project priority first
    assert band_of(None, 1000) > band_of(7, -1000) and band_of(None, 0) == (UNRANKED, 0)


def test_the_newest_of_the_lowest_band_is_displaced_first() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("hi", "p", band_of(0, 0), 1.0)
    old = queue.push("old-low", "p", band_of(2, 0), 1.0)
    new = queue.push("new-low", "q", band_of(2, 0), 1.0)
    assert queue.last_of_lowest_band() is new
    queue.remove(new)
    assert queue.last_of_lowest_band() is old


def test_a_share_must_be_positive() -> None:
    with pytest.raises(ValueError, match="share"):
        FairQueue[int]().push(1, "p", (0, 0), 0.0)
    assert math.isfinite(FairQueue[int]().vtime)
