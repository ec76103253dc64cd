"""The project's one exception tree.

Every error llmgw raises on purpose derives from `LlmgwError`, so an edge (a CLI command, an HTTP handler) can
turn any of them into a clear message with one `except`, and tracebacks never reach a user or a client.
Add subclasses here rather than defining exception bases elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.core.config.errors import ConfigError, SemanticError


class LlmgwError(Exception):
    """Base of every error llmgw raises on purpose."""


class UsageError(LlmgwError):
    """A command or API was called with arguments that cannot work (bad path, bad option)."""


class ConfigInvalidError(LlmgwError):
    """The cluster repo did not validate; `errors` holds every problem found, with positions."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        self.errors: tuple[ConfigError, ...] = tuple(errors)
        first = self.errors[0].format_text() if self.errors else "no details"
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(f"cluster repo is invalid: {first}{more}")


class CatalogError(LlmgwError):
    """`Catalog.build` refused its documents; `errors` holds every whole-repo problem found.

    The errors point at documents by index and paths inside them; the loader maps them to file:line:col.
    """

    def __init__(self, errors: Sequence[SemanticError]) -> None:
        self.errors: tuple[SemanticError, ...] = tuple(errors)
        first = self.errors[0].describe() if self.errors else "no details"
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(f"catalog is invalid: {first}{more}")


class NotFoundError(LlmgwError):
    """Something named does not exist (a model, a node, a project)."""


class ConflictError(LlmgwError):
    """The request conflicts with the current state (already exists, changed meanwhile)."""


class TransientError(LlmgwError):
    """A failure worth retrying later; `delay` is the suggested wait in seconds, when known."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay
