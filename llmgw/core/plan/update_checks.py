"""The controller's periodic check against the origin (the Cluster's `mirror.check_every`): when the next one is
due, what of its answer is news (an event), and an Update as JSON (the admin API, `llmgw model updates
--json`). Pure: the loop in llmgw.controller.loops.update_checks asks (llmgw.adapters.source_probe.ask_updates)
and keeps the answer; what the answers mean is llmgw.core.plan.weight_updates'.

News is a model whose answer differs from the one before it (its state, the origin's commit, which files
changed): a pending update is one event, not one every period, and an origin that stops answering is one too
(never a silent pass). A model first seen current is no news, nor one first seen with nothing to ask (no source,
a node path, the origin `none`, nothing pinned: the answer says so, and says it at every check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.core.plan.weight_updates import Update
from llmgw.core.words import parse_duration

__all__ = ["check_interval", "news", "news_words", "next_check_at", "update_json"]


def check_interval(check_every: str) -> float | None:
    """Seconds between checks; None: `off`."""
    return None if check_every == "off" else parse_duration(check_every)


def next_check_at(last_at: float | None, since: float, every_s: float | None) -> float | None:
    """When the next check is due: one interval after the last one, or after `since` (the controller began
    leading) when there was none; None when checks are off. A first check waits an interval too, so a
    controller that restarts often does not ask the origin at every start."""
    if every_s is None:
        return None
    return (last_at if last_at is not None else since) + every_s


def _key(u: Update) -> tuple[object, ...]:
    return (u.state, u.revision, u.changed, u.source)


def news(previous: Mapping[str, Update], found: Sequence[Update]) -> list[Update]:
    """What of `found` is worth an event against the answers before it (model -> its last Update)."""
    out: list[Update] = []
    for u in found:
        before = previous.get(u.model)
        if before is None and (u.state == "current" or not u.asked):
            continue
        if before is None or _key(before) != _key(u):
            out.append(u)
    return out


def news_words(u: Update) -> str:
    """The event's message for one model's news."""
    if u.state == "changed":
        return f"{u.source}: {u.detail}; `llmgw model update {u.model} REPO --write` and a commit roll it"
    return f"{u.source}: {u.state}: {u.detail}"


def update_json(u: Update) -> dict[str, Any]:
    files = [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in u.files]
    keys = {
        "model": u.model,
        "source": u.source,
        "state": u.state,
        "detail": u.detail,
        "revision": u.revision,
        "origin": u.origin,
    }
    return keys | {"changed": list(u.changed), "files": files}
