"""Which waiting request goes next for one model: strict priority bands, then fair shares over projects, then
arrival order within a project. Pure: no clock, no I/O, no asyncio (the admission queue holds the futures).

- **Bands** are strictly ordered: a request of a lower band is never served while one of a higher band waits.
  A request's band is `(class rank of the model it asked for, -project priority)`, lower first: the model's
  class (the Cluster's ordered classes; an unranked model after every ranked one) outranks the project's
  priority, so a critical model's request waiting in a fallback's queue goes before a batch model's.
- **Shares** within a band: start-time fair queuing (Goyal, Vin and Cheng, SIGCOMM 1996) over projects, each
  request costing 1 / the project's share. A project's next request starts at the later of its previous
  request's finish and the queue's virtual time (the start of the request served last), and the earliest start
  goes first. Why this and not deficit round robin: it needs no quantum to tune and no round to finish, it
  gives the same bound (two backlogged projects' served counts, each divided by its share, differ by at most
  1/share_a + 1/share_b), and a project that was idle cannot bank credit: it rejoins at the virtual time.
  Why count requests and not reserved tokens: a reservation is the request's cap (often the whole context),
  not its work, and what a waiter is given is one slot.
- **FIFO** within a project and band: a project's requests are served in arrival order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["UNRANKED", "Band", "Entry", "FairQueue", "band_of"]

T = TypeVar("T")

Band = tuple[int, int]  # (class rank, -project priority): the smaller goes first
UNRANKED = 1 << 30  # the class rank of a model without one: after every ranked class


def band_of(class_rank: int | None, priority: int) -> Band:
    return (UNRANKED if class_rank is None else class_rank, -priority)


@dataclass(eq=False, slots=True)
class Entry(Generic[T]):
    """One waiting request. Compared by identity: two requests are never the same entry."""

    item: T
    project: str
    band: Band
    share: float
    seq: int  # arrival order across the whole queue


@dataclass(slots=True)
class FairQueue(Generic[T]):
    """The waiting requests of one model, in flows of one (band, project) each."""

    _flows: dict[tuple[Band, str], deque[Entry[T]]] = field(default_factory=dict)
    _finish: dict[str, float] = field(default_factory=dict)  # virtual finish of each project's last served
    _vtime: float = 0.0
    _seq: int = 0
    _count: int = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Entry[T]]:
        for flow in self._flows.values():
            yield from flow

    @property
    def vtime(self) -> float:
        return self._vtime

    def push(self, item: T, project: str, band: Band, share: float) -> Entry[T]:
        if not share > 0:
            raise ValueError(f"a project's share must be above 0, not {share!r}")
        entry = Entry(item, project, band, share, self._seq)
        self._seq += 1
        self._flows.setdefault((band, project), deque()).append(entry)
        self._count += 1
        return entry

    def start_of(self, project: str) -> float:
        """The virtual start of `project`'s next request: never before the queue's virtual time."""
        return max(self._finish.get(project, 0.0), self._vtime)

    def first(
        self,
        skip: Callable[[Entry[T]], bool] | None = None,
        promised: Callable[[Entry[T]], bool] | None = None,
    ) -> Entry[T] | None:
        """The entry served next, passing over those `skip` says (they keep their places).

        `promised` entries were already picked and are on their way to being served (a wake-up handed out,
        not yet used): they are passed over too, and each counts against its project's start as if served.
        Several slots freed at once hand out several wake-ups before any is used; without this, every one
        would go to the same project's next entries (its start not yet charged), and a batch of two turned
        shares of 1:3 into 1:2."""
        best: Entry[T] | None = None
        best_key: tuple[Band, float, int] | None = None
        for (band, project), flow in self._flows.items():
            if best_key is not None and band > best_key[0]:
                continue
            start = self.start_of(project)
            head: Entry[T] | None = None
            for entry in flow:
                if promised is not None and promised(entry):
                    start += 1.0 / entry.share
                elif skip is None or not skip(entry):
                    head = entry
                    break
            if head is None:
                continue
            key = (band, start, head.seq)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def served(self, entry: Entry[T]) -> None:
        """`entry` got its slot: it leaves, and its project is charged one request at its share."""
        self._take(entry)
        self.charge(entry.project, entry.share)

    def charge(self, project: str, share: float) -> None:
        """`project` got a slot (from the queue, or straight away while nobody waited): one request at its
        share. Charging every admission keeps the bound over all of them, and a project's lead over the
        virtual time stays at most one request's cost, so a quiet spell banks nothing either way."""
        start = self.start_of(project)
        self._finish[project] = start + 1.0 / share
        self._vtime = start
        self._forget_idle()

    def remove(self, entry: Entry[T]) -> None:
        """`entry` leaves without being served (its deadline, its client gone): nobody is charged."""
        self._take(entry)

    def last_of_lowest_band(self) -> Entry[T] | None:
        """The newest entry of the lowest band: the one a higher band's request displaces from a full queue."""
        worst: Entry[T] | None = None
        for (band, _), flow in self._flows.items():
            tail = flow[-1]
            if worst is None or (band, tail.seq) > (worst.band, worst.seq):
                worst = tail
        return worst

    def _take(self, entry: Entry[T]) -> None:
        key = (entry.band, entry.project)
        flow = self._flows[key]
        flow.remove(entry)  # ValueError if it is not here: a caller's bug, never hidden
        self._count -= 1
        if not flow:
            del self._flows[key]

    def _forget_idle(self) -> None:
        # A project whose finish is behind the virtual time carries nothing (it would start at the virtual
        # time anyway): forgetting it keeps the table as small as the projects that matter now.
        if len(self._finish) > 2 * len(self._flows) + 16:
            waiting = {project for _, project in self._flows}
            for project, finish in list(self._finish.items()):
                if finish <= self._vtime and project not in waiting:
                    del self._finish[project]
