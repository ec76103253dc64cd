"""The usage summary of a window (what `plan` joins its changes with), read from the store.

The rows are read in pages by (time, id), oldest first, and folded as they come (llmgw.core.usage_summary):
memory stays at a few bytes a request however long the window, and the store sorts on its time index. The
measured capacities come along, so a saved summary is all a plan without the cluster needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.core.usage_summary import MeasuredCapacity, UsageFolder, UsageRow, UsageSummary

if TYPE_CHECKING:
    from llmgw.store.store import Store

__all__ = ["PAGE_ROWS", "read_usage_summary"]

PAGE_ROWS = 5000
_COLUMNS = "id, time, org, team, project, model, tokens_in, tokens_out, cost, latency_ms, status"


async def read_usage_summary(
    store: Store, *, since: float, until: float, page_rows: int = PAGE_ROWS
) -> UsageSummary:
    """Every usage row completed in [since, until), folded; with every stored capacity measurement."""
    folder = UsageFolder(since, until)
    after: tuple[float, str] | None = None
    while True:
        params: tuple[float | str | int, ...]
        if after is None:
            where, params = "time >= ? AND time < ?", (since, until, page_rows)
        else:  # keyset paging: the next rows after the last one read, in the same order
            where = "time < ? AND (time > ? OR (time = ? AND id > ?))"
            params = (until, after[0], after[0], after[1], page_rows)
        async with store.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_COLUMNS} FROM usage WHERE {where} ORDER BY time, id LIMIT ?", params
            )
        for r in rows:
            folder.add(
                UsageRow(time=float(r[1]), org=r[2], team=r[3], project=r[4], model=r[5],
                         tokens_in=int(r[6]), tokens_out=int(r[7]), cost=float(r[8]),
                         latency_ms=float(r[9]), status=int(r[10]))
            )  # fmt: skip
        if len(rows) < page_rows:
            break
        after = (float(rows[-1][1]), str(rows[-1][0]))
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
