"""The controller's commit statuses (settings `commit_status_url` and `commit_status_token_file`): a
canary's progress and verdict, and each revision's apply, posted on the commit they are about, where the
repo's CI (a branch protection rule, a merge check) asks for them.

| event | context | state |
|---|---|---|
| canary_started | CONTEXT/canary/MODEL | pending |
| canary_promoted / canary_failed | CONTEXT/canary/MODEL | success / failure |
| revision_applied / revision_refused | CONTEXT/apply | success / failure |

Posted in the background, in order, retried with backoff (llmgw.adapters.commit_status): a forge that is
down never holds a rollout. A status that could not be posted is a `commit_status_failed` event; the log
warns once until a post succeeds again, and says so then. A revision that is not a commit (a plain
directory's content hash, an apply's label) has no status: said once in the log.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from llmgw.adapters.commit_status import CommitStatus, State, StatusPoster, is_commit_sha

if TYPE_CHECKING:
    from llmgw.controller.core import Controller

log = logging.getLogger("llmgw.controller.commit_statuses")

__all__ = ["CommitStatuses", "status_for"]

_CANARY: dict[str, tuple[State, str]] = {
    "canary_started": ("pending", "canary started"),
    "canary_promoted": ("success", "canary promoted"),
    "canary_failed": ("failure", "canary failed"),
}


def status_for(
    kind: str, obj: str, message: str, revision: str, context: str, target_url: str | None
) -> CommitStatus | None:
    """The status an event posts on `revision`, or None (not an event with a status)."""
    if kind in _CANARY:
        state, words = _CANARY[kind]
        return CommitStatus(revision, state, f"{context}/canary/{obj}", f"{words}: {message}", target_url)
    if kind == "revision_applied":
        return CommitStatus(revision, "success", f"{context}/apply", f"applied {message}", target_url)
    if kind == "revision_refused":
        return CommitStatus(revision, "failure", f"{context}/apply", f"refused: {message}", target_url)
    return None


class CommitStatuses:
    """An event hook of the controller (`Controller.event_hooks`)."""

    def __init__(self, c: Controller, poster: StatusPoster) -> None:
        self.c, self.poster = c, poster
        self.failing = False  # warned, until a post succeeds
        self.told_not_commit = False

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
        if revision is None:
            return
        if not is_commit_sha(revision):
            if not self.told_not_commit:
                self.told_not_commit = True
                log.info("revision %s is not a git commit: no commit status is posted for it", revision[:16])
            return
        status = status_for(
            kind, obj, message, revision, settings.commit_status_context, settings.commit_status_target_url
        )
        if status is None:
            return
        problem = await self.poster.post(status)
        if problem is None:
            if self.failing:
                self.failing = False
                log.info("commit statuses are posted again (%s on %s)", status.context, revision[:12])
            return
        if not self.failing:
            self.failing = True
            log.warning("a commit status could not be posted (the rollout goes on): %s", problem)
        await self.c.event(
            "commit_status_failed", status.context, f"{status.state} on {revision[:12]} not posted: {problem}"
        )
