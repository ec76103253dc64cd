"""The store kept bounded (issue 21): the leader prunes per-request usage rows into per-minute aggregates,
old aggregates, expired content, the content of projects that no longer keep any, and people's chat threads
older than the Cluster's `console.threads.retention` (issue 44).

Each pass works in bounded batches (`retention_batch` rows a transaction) and yields to the event loop
between them, so a large backlog (a first run on a store kept for a year) drains over several passes without
holding the store's write lock for long. Only the leader prunes: two controllers pruning the same minutes
would both read them before either deleted them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from llmgw.controller.parts.fleet import FleetActor
from llmgw.core.desired.catalog import Catalog
from llmgw.core.errors import Outage, TransientError, retry_after
from llmgw.core.traffic.recorded import content_ttl, usage_cutoff
from llmgw.core.words import parse_duration
from llmgw.store.queries.content import ContentError, ContentVault, parse_content_key

log = logging.getLogger("llmgw.controller.loops.retention")

MAX_BATCHES_PER_PASS = 200  # then the next pass goes on: other store users get their turn


@dataclass
class PassResult:
    usage_rows: int = 0
    minutes_written: int = 0
    minutes_deleted: int = 0
    content_expired: int = 0
    content_withdrawn: int = 0
    threads_pruned: int = 0


def load_content_vault(c: FleetActor) -> ContentVault | None:
    """The vault under the configured content key; None without one (no content is kept)."""
    path: Path | None = c.settings.content_key_file
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContentError(f"content_key_file {path}: {exc.strerror}") from None
    return ContentVault(c.store, parse_content_key(text, f"content_key_file {path}"))


def _budget_periods(catalog: Catalog) -> list[float]:
    tenants = [*catalog.organizations.values(), *catalog.teams.values(), *catalog.projects.values()]
    return [parse_duration(t.limits.budget.period) for t in tenants if t.limits.budget is not None]


class Retention:
    def __init__(self, c: FleetActor) -> None:
        self.c = c
        self.passes = 0  # completed passes (tests and status read it)
        self.last: PassResult | None = None
        self._failing = Outage(log, "pruning usage and content")
        self._keyless: frozenset[str] = frozenset()  # projects opted in without a content key, warned once
        # Read now so a bad key file stops the controller at start, naming the file; the vault is what a
        # content API (Responses `store`) is to use.
        self.vault = load_content_vault(c)

    async def prune_once(self) -> PassResult:
        c, s = self.c, self.c.settings
        now = c.wall()
        result = PassResult()
        d = c.desired
        # Without an applied revision the budgets are not known, so neither is how far back their spend reads.
        cutoff = usage_cutoff(now, s.usage_retention_s, _budget_periods(d.catalog)) if d is not None else None
        for _ in range(MAX_BATCHES_PER_PASS if cutoff is not None else 0):
            step = await c.store.prune_usage(cutoff or 0.0, s.retention_batch)
            result.usage_rows += step.rows
            result.minutes_written += step.minutes
            if step.rows == 0:
                break
            await asyncio.sleep(0)
        result.minutes_deleted = await c.store.prune_usage_minutes(now - s.usage_minutes_retention_s)
        for _ in range(MAX_BATCHES_PER_PASS):
            gone = await c.store.prune_content(now, s.retention_batch)
            result.content_expired += gone
            if gone < s.retention_batch:
                break
        result.content_withdrawn = await self._withdrawn()
        if d is not None:  # without an applied revision the retention is not known: nothing is deleted
            retention_s = parse_duration(d.cluster.console.threads.retention)
            result.threads_pruned = await c.store.prune_threads(now - retention_s)
        return result

    async def _withdrawn(self) -> int:
        """Delete the content of projects the applied revision does not let keep any (opt-in withdrawn, or the
        project removed). Without an applied revision nothing is known, and nothing is deleted."""
        d = self.c.desired
        if d is None:
            return 0
        keeping = {name for name, t in d.catalog.projects.items() if content_ttl(t.retention) is not None}
        keyless = frozenset(keeping) if self.vault is None else frozenset()
        if keyless != self._keyless:
            if keyless:
                log.warning(
                    "projects %s opt in to keep content, but this controller has no content_key_file: "
                    "nothing is kept for them",
                    ", ".join(sorted(keyless)),
                )
            else:
                log.info("no project opts in to keep content without a content key any more")
            self._keyless = keyless
        deleted = 0
        for project in await self.c.store.content_projects():
            if project not in keeping:
                n = await self.c.store.delete_project_content(project)
                log.info("deleted %d kept contents of project %s: it keeps no content now", n, project)
                deleted += n
        return deleted

    async def run(self) -> None:
        while True:
            wait = self.c.settings.retention_check_s
            if self.c.leading():
                try:
                    self.last = await self.prune_once()
                    self.passes += 1
                    self._failing.recovered()
                    last = self.last
                    if (
                        last.usage_rows
                        or last.content_expired
                        or last.content_withdrawn
                        or last.threads_pruned
                    ):
                        log.info("pruned %s", self.last)
                except TransientError as exc:  # the store down: the next pass prunes the same rows
                    wait = retry_after(exc, default=wait, most=wait)
                    self._failing.failed(exc, wait)
                except Exception as exc:  # a bug must not end pruning
                    self._failing.failed(exc, wait)
            await self._pause(wait)

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
