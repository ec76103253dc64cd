"""The controller's commit statuses (settings `commit_status_url` and `commit_status_token_file`): a
canary's progress and verdict, and each revision's apply, posted on the commit they are about, where the
repo's CI (a branch protection rule, a merge check) asks for them.

| event | context | state |
|---|---|---|
| canary_started | CONTEXT/canary/MODEL | pending |
| canary_promoted / canary_failed | CONTEXT/canary/MODEL | success / failure |
| revision_applied / revision_refused | CONTEXT/apply | pending / failure |
| every model of the applied revision Healthy | CONTEXT/apply | success |

The apply's success says the fleet runs what the revision declares (every model Healthy: rolled, its canary
decided), not only that the revision was read. Each status is written to the store's outbox before its first
attempt and deleted once the forge took it, so a status owed by a controller that died is posted by the next
leader, once; the apply's success is marked in the store once per revision (whichever leader sees it Healthy).
Posted in the background, in order, retried with backoff (llmgw.adapters.commit_status): a forge that is
down never holds a rollout. A status that could not be posted after its retries is a `commit_status_failed`
event and leaves the outbox; the log warns once until a post succeeds again, and says so then. A revision that
is not a commit (a plain directory's content hash, an apply's label) has no status: said once in the log.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Protocol

from llmgw.adapters.commit_status import CommitStatus, State, StatusPoster, is_commit_sha
from llmgw.controller.parts.fleet import FleetActor
from llmgw.controller.parts.state import RefusedRevision
from llmgw.controller.status import fleet as views
from llmgw.core.errors import Outage, TransientError, retry_after
from llmgw.store.errors import StoreError
from llmgw.store.queries.intent import OwedStatus

log = logging.getLogger("llmgw.controller.loops.commit_statuses")

__all__ = ["CommitStatuses", "status_for"]

_CANARY: dict[str, tuple[State, str]] = {
    "canary_started": ("pending", "canary started"),
    "canary_promoted": ("success", "canary promoted"),
    "canary_failed": ("failure", "canary failed"),
}


_STATES: dict[str, State] = {
    "pending": "pending",
    "success": "success",
    "failure": "failure",
    "error": "error",
}


def status_for(
    kind: str, obj: str, message: str, revision: str, context: str, target_url: str | None
) -> CommitStatus | None:
    """The status an event posts on `revision`, or None (not an event with a status)."""
    if kind in _CANARY:
        state, words = _CANARY[kind]
        return CommitStatus(revision, state, f"{context}/canary/{obj}", f"{words}: {message}", target_url)
    if kind == "revision_applied":
        words = f"applied {message}; rolling out"
        return CommitStatus(revision, "pending", f"{context}/apply", words, target_url)
    if kind == "revision_healthy":
        return CommitStatus(revision, "success", f"{context}/apply", message, target_url)
    if kind == "revision_refused":
        return CommitStatus(revision, "failure", f"{context}/apply", f"refused: {message}", target_url)
    return None


class StatusesParts(FleetActor, Protocol):
    """What commit statuses read besides a FleetActor: the refused revision (a refused commit is marked)."""

    @property
    def refused(self) -> RefusedRevision | None: ...


class CommitStatuses:
    """An event hook of the controller (`Controller.event_hooks`), and a loop (`run`) that posts what a
    controller before this one owed and the apply's success once the fleet runs the revision."""

    TICK_S = 1.0
    RETRY_MAX_S = 30.0  # after a failure, the next tick never later than this, whatever the error says

    def __init__(self, c: StatusesParts, poster: StatusPoster) -> None:
        self.c, self.poster = c, poster
        self.failing = False  # warned, until a post succeeds
        self.told_not_commit = False
        self._delivering = asyncio.Lock()  # one delivery at a time: the outbox's order is the forge's
        self._seq = 0

    def _revision(self, kind: str) -> str | None:
        c = self.c
        if kind == "revision_refused":
            return c.refused.revision if c.refused is not None else None
        return c.desired.revision if c.desired is not None else None

    async def on_event(self, kind: str, obj: str, message: str, now: float) -> None:
        settings = self.c.settings
        revision = (
            self._revision(kind) if kind in (*_CANARY, "revision_applied", "revision_refused") else None
        )
        if revision is None or not self._is_commit(revision):
            return
        status = status_for(
            kind, obj, message, revision, settings.commit_status_context, settings.commit_status_target_url
        )
        if status is None:
            return
        # A restarted controller or a new leader applies the same revision again: its apply was said already.
        if kind == "revision_applied" and not await self._first(f"commit-status applied {revision}", now):
            return
        await self._owe(status, now)

    async def _first(self, mark: str, now: float) -> bool:
        """True the first time (across controllers: a mark in the store); True too when the store cannot say
        (a status said twice is better than one never said)."""
        try:
            return await self.c.store.mark_once(mark, now)
        except StoreError as exc:
            log.warning(
                "commit statuses: the store cannot say whether %s was posted (%s): posting it", mark, exc
            )
            return True

    def _is_commit(self, revision: str) -> bool:
        if is_commit_sha(revision):
            return True
        if not self.told_not_commit:
            self.told_not_commit = True
            log.info("revision %s is not a git commit: no commit status is posted for it", revision[:16])
        return False

    async def _owe(self, status: CommitStatus, now: float) -> None:
        """Into the outbox, then delivered with whatever else is owed (in order)."""
        self._seq += 1
        owed = OwedStatus(
            uuid.uuid4().hex,
            now + self._seq * 1e-6,  # two statuses of one moment keep the order they were made in
            status.sha,
            status.state,
            status.context,
            status.description,
            status.target_url or "",
        )
        try:
            await self.c.store.owe_commit_status(owed)
        except StoreError as exc:  # posted all the same; only a controller dying now would lose it
            log.warning("commit status %s not written to the outbox: %s", status.context, exc)
            await self._post(owed)
            return
        await self.deliver()

    async def deliver(self) -> None:
        """Post every status the outbox holds, oldest first; each leaves it once the forge took it, or once
        it could not be posted after the poster's retries (a `commit_status_failed` event says so)."""
        async with self._delivering:
            for owed in await self.c.store.owed_commit_statuses():
                if not self.c.leading():
                    return  # the next leader posts the rest
                await self._post(owed)
                await self.c.store.commit_status_posted(owed.id)

    async def _post(self, owed: OwedStatus) -> None:
        state = _STATES.get(owed.state, "error")
        status = CommitStatus(owed.sha, state, owed.context, owed.description, owed.target_url or None)
        problem = await self.poster.post(status)
        if problem is None:
            if self.failing:
                self.failing = False
                log.info("commit statuses are posted again (%s on %s)", status.context, status.sha[:12])
            return
        if not self.failing:
            self.failing = True
            log.warning("a commit status could not be posted (the rollout goes on): %s", problem)
        await self.c.event(
            "commit_status_failed",
            status.context,
            f"{status.state} on {status.sha[:12]} not posted: {problem}",
        )

    async def run(self) -> None:
        """On becoming the leader (or at start), post what is owed; then, once a second, the apply's success
        when every model of the applied revision is Healthy."""
        was_leading = False
        failing = Outage(log, "commit statuses")
        while True:
            leading = self.c.leading() and self.c.fleet.worker_state.earlier_state_read
            wait = self.TICK_S
            try:
                if leading and not was_leading:
                    await self.deliver()
                if leading:
                    await self._healthy()
                failing.recovered()
            except TransientError as exc:  # the store is down: delivered again once it answers
                wait = retry_after(exc, default=self.TICK_S, most=self.RETRY_MAX_S)
                failing.failed(exc, wait)
                leading = False
            except Exception as exc:  # a bug must not end the posting; delivered again at the next tick
                failing.failed(exc, wait)
                leading = False
            was_leading = leading
            await self._pause(wait)

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _healthy(self) -> None:
        c = self.c
        d = c.desired
        if d is None or not is_commit_sha(d.revision):
            return
        if any(views.model_health(c, name)["health"] != "Healthy" for name in d.models):
            return
        if any(c.fleet.canaries.held(name, d) for name in d.models):
            return  # a canary of this revision failed: the fleet runs the stable model, not the revision
        if not await self._first(f"commit-status healthy {d.revision}", c.wall()):
            return  # said already (by this leader or one before)
        settings = c.settings
        words = f"healthy: the fleet runs {d.revision[:12]} ({len(d.models)} model(s))"
        status = status_for(
            "revision_healthy",
            "",
            words,
            d.revision,
            settings.commit_status_context,
            settings.commit_status_target_url,
        )
        assert status is not None
        await self._owe(status, c.wall())
