"""The store's errors, apart from its drivers: a caller that only catches them (the router's key check)
imports no psycopg or sqlite3 through this module."""

from __future__ import annotations

__all__ = ["StoreError", "StoreUnavailable"]


class StoreError(Exception):
    """A store operation failed (bad DSN, constraint, schema from the future, ...)."""


class StoreUnavailable(StoreError):
    """The database could not be reached or did not answer; the operation may be retried."""
