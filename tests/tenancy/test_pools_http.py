"""Limits as pools: projects under one team (or organization) share its rpm, and two router processes over
one PostgreSQL store together let a project through no more than its rpm (docs/tenancy.md: margin 0 for rpm
while the store answers)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .helpers import create_key, in_one_window, outcome, start_router, window_start_offset

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("first", "second", "named"),
    [("team-a", "team-b", "team 'pooled'"), ("org-a", "org-b", "organization 'pooled-org'")],
    ids=["team", "organization"],
)
def test_projects_share_their_parents_rpm(
    store_dsn: str, snap: dict[str, Any], tmp_path: Path, first: str, second: str, named: str
) -> None:
    # Neither project sets an rpm; their team (or, for the other pair, their organization) allows 6.
    keys = [create_key(store_dsn, first), create_key(store_dsn, second)]
    offset = window_start_offset()
    router = start_router(tmp_path, snap, store_dsn, clock_offset=offset)
    try:
        clients = [router.client(k) for k in keys]

        def alternate() -> list[str]:
            return [outcome(clients[i % 2]) for i in range(10)]

        outcomes = in_one_window(offset, alternate)
        for c in clients:
            c.close()
    finally:
        assert router.stop() == 0, router.text()[-3000:]
    # 3 each, then both refused: alone, either project would have had all 6
    assert outcomes[:6] == ["ok"] * 6
    for message in outcomes[6:]:
        assert named in message and "6 requests per minute" in message, message


@pytest.mark.postgres
def test_two_routers_together_stay_within_the_rpm(pg_dsn: str, snap: dict[str, Any], tmp_path: Path) -> None:
    limit, requests = 10, 60  # project `shared`: 10 requests per minute
    key = create_key(pg_dsn, "shared")
    offset = window_start_offset()  # one offset for both: they share the store's windows
    routers = [start_router(tmp_path, snap, pg_dsn, name=f"router-{i}", clock_offset=offset) for i in (1, 2)]
    try:
        clients = [r.client(key) for r in routers]

        def burst() -> list[tuple[int, str]]:
            # one request through each router first, so both are known to serve; then all at once
            out = [(i, outcome(clients[i])) for i in (0, 1)]
            with ThreadPoolExecutor(8) as pool:
                out += pool.map(lambda n: (n % 2, outcome(clients[n % 2])), range(requests - 2))
            return out

        outcomes = in_one_window(offset, burst)
        for c in clients:
            c.close()
    finally:
        for r in routers:
            assert r.stop() == 0, r.text()[-3000:]
    assert outcomes[0][1] == outcomes[1][1] == "ok"
    served = [sum(1 for i, o in outcomes if i == r and o == "ok") for r in (0, 1)]
    refused = [o for _, o in outcomes if o != "ok"]
    # margin 0 for rpm; the pool may be under-used by at most one share (10% of 10 = 1) per router
    assert limit - 2 <= sum(served) <= limit, served
    assert len(refused) == requests - sum(served)
    for message in refused:
        assert "project 'shared'" in message and f"{limit} requests per minute" in message, message
