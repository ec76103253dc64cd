"""The project's one exception tree.

Every error llmgw (and llmgw_router) raises on purpose derives from `LlmgwError`, so an edge (a CLI command,
an HTTP handler) can turn any of them into a clear message with one `except`, and tracebacks never reach a
user or a client. Third-party errors (sqlite3, psycopg, git, aiohttp, asyncssh) are translated at the adapter
that calls the library, never further in.

    LlmgwError
    ├── ConfigInvalidError      the cluster repo did not validate (controller.desired, every error with position)
    ├── CatalogError            Catalog.build refused its documents
    ├── TransientError(delay)   worth retrying: store.StoreUnavailable, adapters.sources.SourceUnavailable,
    │                           llmgw_router.upstream.proxy.UpstreamUnavailable
    └── the rest, defined beside the code that raises them: StoreError, SpoolError, SecretError,
        SecretRefError, AgentError, WheelhouseError, CAError, StepFailed, SettingsError, ApiError, ...

A loop that retries catches `TransientError` (or the subclass its work raises), waits `retry_after(exc, ...)`
(the raiser's `delay`, else the loop's own schedule, bounded by the loop's longest wait) and says the failure
once per outage through an `Outage`. docs/architecture.md ("Errors") lists who reads `delay`.

A class that must also be caught as a standard one (an OSError in an aiohttp path, a ValueError of pydantic)
names both bases; tests/config/test_error_tree.py holds every exception class of llmgw and llmgw_router to
this root. The agent is separate: it imports nothing of llmgw.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.core.config.errors import SemanticError

__all__ = ["CatalogError", "ConfigInvalidError", "LlmgwError", "Outage", "TransientError", "retry_after"]


class LlmgwError(Exception):
    """Base of every error llmgw raises on purpose."""


class ConfigInvalidError(LlmgwError):
    """The cluster repo did not validate; `errors` holds every problem, each a `file:line:col: path: message` line."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors: list[str] = list(errors)
        super().__init__(f"{len(self.errors)} error(s) in the cluster repo")


class CatalogError(LlmgwError):
    """`Catalog.build` refused its documents; `errors` holds every whole-repo problem found.

    The errors point at documents by index and paths inside them; the loader maps them to file:line:col.
    """

    def __init__(self, errors: Sequence[SemanticError]) -> None:
        self.errors: tuple[SemanticError, ...] = tuple(errors)
        first = self.errors[0].describe() if self.errors else "no details"
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(f"catalog is invalid: {first}{more}")


class TransientError(LlmgwError):
    """A failure worth retrying. `delay`: seconds to wait first, when the raiser knows (0: at once, elsewhere);
    None leaves it to the caller's own schedule (the next poll, the lease's renew interval, its backoff)."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


def retry_after(exc: BaseException, default: float, most: float) -> float:
    """Seconds a loop waits before its next attempt after `exc`: the raiser's `delay` when `exc` is transient
    and says one, else the loop's own `default`; never more than `most` (the loop's bound), never negative."""
    delay = exc.delay if isinstance(exc, TransientError) else None
    return max(0.0, min(default if delay is None else delay, most))


class Outage:
    """A retried failure said once per outage, not once per attempt: `failed` logs the first failure (with its
    traceback when it is not transient: then it is a bug, and the traceback is the news), `recovered` the end.

    `what` names what failed ("the notification sender"); attempts in between are counted, not logged.
    """

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what
        self.failures = 0  # attempts failed in this outage (0: none is going on)

    @property
    def down(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException, retry_in: float) -> None:
        self.failures += 1
        if self.failures > 1:
            return
        if isinstance(exc, TransientError):
            self.log.warning("%s failed, retrying in %.1fs until it works: %s", self.what, retry_in, exc)
        else:
            self.log.error("%s failed, retrying in %.1fs until it works", self.what, retry_in, exc_info=exc)

    def recovered(self) -> None:
        if self.failures:
            self.log.info("%s works again (after %d failed attempt(s))", self.what, self.failures)
        self.failures = 0
