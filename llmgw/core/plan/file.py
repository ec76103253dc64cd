"""A saved plan (`llmgw plan --out FILE`) and the rule that refuses one the world has moved past.

Pure: the CLI reads and writes the file and hashes the repo directory; this module builds the body, names
what the plan would do by a digest, and decides whether `llmgw apply FILE` may still apply it.

A saved plan is current when (1) the repo's content hash is the one it was made from, (2) the controller has
applied no other revision since, and (3) either the live state is byte-for-byte the one it saw or, planned again
against the live state as it is now, the plan would do exactly the same (a node's free disk moving is no reason
to plan again; a replica becoming ready is).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.views import LiveState
from llmgw.core.plan.diff import plan_for_catalog
from llmgw.core.plan.render import to_dict
from llmgw.core.plan.values import Plan
from llmgw.core.words import short

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog

__all__ = ["PLAN_FORMAT", "StalePlan", "check_plan_current", "parse_saved_plan", "plan_digest", "saved_plan"]

PLAN_FORMAT = "llmgw-plan/v1"


class StalePlan(LlmgwError):
    """A saved plan no longer says what applying would do; the message says why and to plan again."""


def plan_digest(plan_dict: dict[str, Any]) -> str:
    """What the plan would do, without the hashes that name the inputs: equal digests, equal actions."""
    # A source check's answers are what servers said, not what applying does (apply does not ask again);
    # the Impact is what recent traffic says, which moves on while the actions stay the same.
    body = {k: v for k, v in plan_dict.items() if k not in ("live_state_hash", "sources", "impact")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def saved_plan(
    plan: Plan,
    *,
    repo_path: str,
    repo_revision: str | None,
    repo_content_hash: str,
    live_source: str,
    created_at: float,
) -> dict[str, Any]:
    """The body of a plan file: the plan, what it was made from, and its digest."""
    body = to_dict(plan)
    return {
        "format": PLAN_FORMAT,
        "created_at": created_at,
        "repo": {"path": repo_path, "revision": repo_revision, "content_hash": repo_content_hash},
        "live": {"source": live_source, "revision": plan.live_revision, "state_hash": plan.live_state_hash},
        "digest": plan_digest(body),
        "plan": body,
    }


def parse_saved_plan(text: str) -> dict[str, Any] | None:
    """The saved plan in `text`, or None when it is not one (JSON of another shape, or not JSON)."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("format") != PLAN_FORMAT:
        return None
    return body


def check_plan_current(
    saved: dict[str, Any], *, repo_content_hash: str, catalog: Catalog, live: LiveState
) -> None:
    """Raise StalePlan unless `saved` is current (the module's rule) for the repo hashed now and `live`."""
    repo = saved["repo"]
    if repo_content_hash != repo["content_hash"]:
        raise StalePlan(
            f"the cluster repo at {repo['path']} changed after the plan was made; "
            "run `llmgw plan --out FILE` again and apply the new plan"
        )
    was = saved["live"]
    if live.revision != was["revision"]:
        raise StalePlan(
            f"the saved plan is stale: it was made against revision {short(was['revision'])}, and the "
            f"controller has applied {short(live.revision)} since; run `llmgw plan --out FILE` again"
        )
    if live.content_hash() == was["state_hash"]:
        return
    # The fleet moved (a replica became ready, a node's free disk changed): fine only if the plan did not.
    now = to_dict(plan_for_catalog(catalog, live))
    if plan_digest(now) != saved["digest"]:
        raise StalePlan(
            f"the saved plan is stale: the live state changed after it was made (state "
            f"{was['state_hash'][:12]} -> {live.content_hash()[:12]}) and the plan would now be different "
            f"({now['summary']}); run `llmgw plan --out FILE` again"
        )
