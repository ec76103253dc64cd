"""The `store` fixture: every store test runs on SQLite and on PostgreSQL (ids sqlite, postgres)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.store import Store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'llmgw.db'}"
    return str(request.getfixturevalue("pg_dsn"))


@pytest.fixture
async def store(store_dsn: str) -> AsyncIterator[Store]:
    opened = await Store.open(store_dsn)
    yield opened
    await opened.close()
