"""The router's small interfaces to the outside: usage accounting and the controller. Each has a do-nothing
implementation so the router runs with no store and no controller, and unit tests inject fakes."""

from __future__ import annotations

import logging
from typing import Protocol

from llmgw.store.records import UsageRecord

__all__ = ["ControllerCallbacks", "NoController", "NullUsage", "UsageSink"]

log = logging.getLogger(__name__)


class UsageSink(Protocol):
    def record(self, rec: UsageRecord) -> None:
        """Take one usage record; must not block (a batched writer queues it)."""


class NullUsage:
    def record(self, rec: UsageRecord) -> None:
        return None


class ControllerCallbacks(Protocol):
    def request_load(self, model: str) -> None:
        """Ask for a replica of an on-demand model; must not block."""


class NoController:
    """A static router: nobody can load an on-demand model, so say so once per model."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def request_load(self, model: str) -> None:
        if model not in self._warned:
            self._warned.add(model)
            log.warning("model %s is on demand but this router has no controller to load it", model)
