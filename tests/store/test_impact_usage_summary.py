"""The usage summary's store query on SQLite and PostgreSQL: the window's bounds, keyset paging through rows
that share a completion time, and the capacities it carries. The folding itself is pure (tests/plan)."""

from __future__ import annotations

from llmgw.store import Store, UsageRecord
from llmgw.store.queries.capacity import CapacityRecord
from llmgw.store.usage.usage_summary import read_usage_summary

T = 1_790_000_040.0


def _row(i: int, at: float, project: str = "p", model: str = "m") -> UsageRecord:
    return UsageRecord(
        time=at,
        request_id=f"r{i}",
        project=project,
        team="t",
        org="o",
        model=model,
        status=200,
        tokens_in=10,
        tokens_out=5,
        cost=0.25,
        latency_ms=1000.0,
        id=f"u{i:04d}",
    )


async def test_every_row_in_the_window_is_read_once_across_pages_that_share_a_time(store: Store) -> None:
    rows = [_row(i, T + (i // 7)) for i in range(50)]  # seven rows at each second: pages split a second
    rows += [_row(100, T - 1), _row(101, T + 3600)]  # one before the window, one at its end (excluded)
    await store.insert_usage(rows)
    for page_rows in (3, 10, 1000):  # pages inside one second, pages that split one, one page
        got = await read_usage_summary(store, since=T, until=T + 3600, page_rows=page_rows)
        assert got.rows == 50 and got.earliest == T, page_rows
        (pair,) = got.pairs
        assert pair.requests == 50, page_rows
    (pair,) = got.pairs
    assert (pair.requests, pair.tokens_in, pair.tokens_out, pair.cost) == (50, 500, 250, 12.5)
    team = got.tenant("team", "t")
    assert team is not None and (team.peak_rpm, team.peak_tpm) == (50, 750)  # all in one minute
    model = got.model("m")
    assert model is not None and model.peak_concurrency == 7  # a second long, seven ending each second


async def test_the_summary_carries_every_measured_capacity_and_an_empty_window_is_empty(store: Store) -> None:
    await store.save_capacity(CapacityRecord("m", "sim", "", "sim", T, 100.0, 6, 50.0, None, None, None))
    await store.save_capacity(
        CapacityRecord("m", "gpu", "h100", "vllm", T, 100.0, None, None, None, None, None)
    )
    got = await read_usage_summary(store, since=T, until=T + 60)
    assert (got.rows, got.earliest, got.pairs, got.models, got.tenants) == (0, None, [], [], [])
    assert [(c.profile, c.gpu_class, c.concurrency) for c in got.capacity] == [
        ("gpu", "h100", None),
        ("sim", "", 6),
    ]
