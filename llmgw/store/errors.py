"""The store's errors, apart from its drivers: a caller that only catches them (the router's key check)
imports no psycopg or sqlite3 through this module."""

from __future__ import annotations

from llmgw.core.errors import LlmgwError, TransientError

__all__ = ["LeaseFenced", "StoreError", "StoreUnavailable", "unreachable_words"]


class StoreError(LlmgwError):
    """A store operation failed (bad DSN, constraint, schema from the future, ...)."""


class StoreUnavailable(StoreError, TransientError):
    """The database could not be reached or did not answer; the operation may be retried."""


class LeaseFenced(StoreError):
    """A write only a lease's holder may make came with a holder or epoch the lease no longer has: the writer
    was deposed (its claim ran out and another took the lease) and must stop acting."""


def unreachable_words(exc: BaseException, timeout_s: float) -> str:
    """Why a store call failed, for a log line: the error's own words, or, for the call's deadline (a
    TimeoutError says nothing), that the store did not answer in time."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"no answer within {timeout_s:g} s"
    return str(exc) or type(exc).__name__
