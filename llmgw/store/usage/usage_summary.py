"""The usage summary of a window (what `plan` joins its changes with), read from the store.

The rows are read in pages by completion time, oldest first, and folded as they come (llmgw.core.traffic.usage_summary):
memory stays at a few bytes a request however long the window, and the store sorts on its time index. The
measured capacities come along, so a saved summary is all a plan without the cluster needs.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from llmgw.core.traffic.usage_summary import MeasuredCapacity, UsageFolder, UsageSummary

if TYPE_CHECKING:
    from llmgw.store.db import Row
    from llmgw.store.store import Store

__all__ = ["PAGE_ROWS", "read_usage_summary"]

PAGE_ROWS = 5000
_COLUMNS = "id, time, org, team, project, model, tokens_in, tokens_out, cost, latency_ms, status"


async def read_usage_summary(
    store: Store, *, since: float, until: float, page_rows: int = PAGE_ROWS
) -> UsageSummary:
    """Every usage row completed in [since, until), folded; with every stored capacity measurement."""
    folder = UsageFolder(since, until)
    cursor, past = since, False  # past: the rows at `cursor` itself were read already
    while True:
        rows = await _fetch(store, f"time {'>' if past else '>='} ? AND time < ?", (cursor, until), page_rows)
        if len(rows) < page_rows:
            await asyncio.to_thread(_fold, folder, rows)
            break
        # Paged by time alone, so each page is a range scan of the time index in its order. The rows at the
        # page's last time may go on past it: they are read with the next page instead.
        last = float(rows[-1][1])
        head = [r for r in rows if float(r[1]) < last]
        past = not head
        if past:  # a whole page completed at one instant: read that instant whole, then go past it
            head = await _fetch(store, "time = ?", (last,), None)
        # Folding is CPU work: in a thread, so a controller's loop answers heartbeats meanwhile.
        await asyncio.to_thread(_fold, folder, head)
        cursor = last
    capacity = [
        MeasuredCapacity(
            model=c.model,
            profile=c.profile,
            gpu_class=c.gpu_class,
            concurrency=c.concurrency,
            measured_at=c.measured_at,
        )
        for c in await store.list_capacity()
    ]
    return folder.summary(capacity)


async def _fetch(store: Store, where: str, params: tuple[float, ...], limit: int | None) -> list[Row]:
    tail, extra = ("ORDER BY time LIMIT ?", (limit,)) if limit is not None else ("", ())
    async with store.db.tx() as tx:
        return await tx.fetch(f"SELECT {_COLUMNS} FROM usage WHERE {where} {tail}", (*params, *extra))


def _fold(folder: UsageFolder, rows: list[Row]) -> None:
    add = folder.add_values
    for r in rows:
        add(float(r[1]), r[2], r[3], r[4], r[5], int(r[6]), int(r[7]), float(r[8]), float(r[9]), int(r[10]))
