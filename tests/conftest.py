"""Fixtures shared by every test directory."""

from tests.fixtures.postgres import pg_dsn, pg_server  # noqa: F401  (registers the PostgreSQL fixtures)
