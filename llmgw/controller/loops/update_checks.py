"""The controller asks the origin for new weights by itself (issue 48): every `mirror.check_every` of the applied
Cluster (default 24h, `off` turns it off) the leader asks whether the files each model pins changed there, as
`llmgw model updates` does (llmgw.adapters.source_probe.ask_updates), keeps the answer for the admin API
(`GET /api/v1/weights/updates`, `llmgw model updates --last`) and records each model's news as a
`weights_update` event (`llmgw events`; a Notification may select it: a webhook).

What is due and what is news are llmgw.core.plan.update_checks' pure decisions. The first check waits one
interval after this controller began leading. Nothing is written to the repo: an update stays a commit someone
makes (`llmgw model update MODEL --write`). The answer is kept in memory: a new leader has none until its first
check (the events of earlier checks are in the store).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmgw.adapters.source_probe import ask_updates
from llmgw.core.errors import Outage
from llmgw.core.plan.update_checks import check_interval, news, news_words, next_check_at, update_json

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import FleetActor
    from llmgw.core.plan.weight_updates import Update

log = logging.getLogger("llmgw.controller.loops.update_checks")

__all__ = ["UPDATE_CHECKS", "UpdateChecks"]

TICK_S = 1.0  # how often the loop looks whether a check is due (a changed setting counts from the next tick)


class UpdateChecks:
    """The periodic check and its last answer."""

    def __init__(self, c: FleetActor) -> None:
        self.c = c
        self.last: dict[str, Update] = {}  # model -> its answer at the last check
        self.checked_at: float | None = None  # when the last check ended
        self.tried_at: float | None = (
            None  # when the last check began, answered or not: what the next counts from
        )
        self.leading_since: float | None = None
        self.checks = 0
        self._failing = Outage(log, "asking the origin for new weights")

    def next_at(self) -> float | None:
        d = self.c.desired
        if d is None or self.leading_since is None:
            return None
        every = check_interval(d.cluster.mirror.check_every)
        return next_check_at(self.tried_at, self.leading_since, every)

    async def check_once(self) -> list[Update]:
        """Ask now; record the news as events and keep the answer."""
        d = self.c.desired
        assert d is not None
        self.tried_at = self.c.wall()
        found = await ask_updates(d.catalog)
        for u in news(self.last, found):
            await self.c.event("weights_update", u.model, news_words(u))
        self.last = {u.model: u for u in found}
        self.checked_at = self.c.wall()
        self.checks += 1
        changed = sorted(u.model for u in found if u.state == "changed")
        log.info(
            "checked %d model(s) at the origin; new weights upstream for: %s", len(found), changed or "none"
        )
        return found

    def answer(self) -> dict[str, Any]:
        """The admin API's UpdateChecksAnswer."""
        d = self.c.desired
        return {
            "check_every": None if d is None else d.cluster.mirror.check_every,
            "checked_at": self.checked_at,
            "next_at": self.next_at() if self.c.leading() else None,
            "updates": [update_json(u) for _, u in sorted(self.last.items())],
        }

    async def tick(self) -> None:
        if not self.c.leading():
            self.leading_since = None
            return
        if self.leading_since is None:
            self.leading_since = self.c.wall()
        due = self.next_at()
        if due is None or due > self.c.wall():
            return
        try:
            await self.check_once()
            self._failing.recovered()
        except Exception as exc:  # a bug must not end the checks; the next one is an interval on
            again = self.next_at()
            self._failing.failed(exc, TICK_S if again is None else max(TICK_S, again - self.c.wall()))

    async def run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(TICK_S)


UPDATE_CHECKS: web.AppKey[UpdateChecks] = web.AppKey("update_checks", UpdateChecks)
