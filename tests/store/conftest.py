"""The `store` fixture: every store test runs on SQLite and on PostgreSQL (`store_dsn`, tests/fixtures)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from llmgw.store import Store


@pytest.fixture
async def store(store_dsn: str) -> AsyncIterator[Store]:
    opened = await Store.open(store_dsn)
    yield opened
    await opened.close()
