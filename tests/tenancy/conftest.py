"""Fixtures for tenancy tests: two sim engines per module, and a store DSN for SQLite and for PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from router.helpers import SimProcess, start_sim, wait_healthy_sync

from .helpers import FAST, SLOW, snapshot


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimProcess, SimProcess]]:
    fast = start_sim(FAST, "engine-key-fast", decode_ms=1.0, concurrency=16)
    slow = start_sim(SLOW, "engine-key-slow", decode_ms=50.0, concurrency=16)
    try:
        wait_healthy_sync([fast, slow])
        yield fast, slow
    finally:
        fast.kill()
        slow.kill()


@pytest.fixture
def snap(sims: tuple[SimProcess, SimProcess]) -> dict[str, Any]:
    return snapshot(*sims)
