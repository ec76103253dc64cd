"""Fixtures shared by every test directory (tests/ is on sys.path: pytest's prepend import mode)."""

from fixtures.llama import llama_server  # noqa: F401  (registers the shared llama-server)
from fixtures.postgres import pg_dsn, pg_server  # noqa: F401  (registers the PostgreSQL fixtures)
from fixtures.stores import store_dsn  # noqa: F401  (registers the both-backends DSN)

# Marks every process the run starts; after the last test, stops and names those still running (the run fails).
pytest_plugins = ["fixtures.leftover_check"]
