"""`controller_dsn`: the store a controller test runs against, SQLite and PostgreSQL (ids sqlite, postgres)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def controller_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'controller.db'}"
    return str(request.getfixturevalue("pg_dsn"))
