"""`llmgw plan`'s usage: the summary it joins the plan with (the Impact section), from the controller or a
saved state, and the saved state file that carries it.

A saved state is the live state's JSON with one more key, `usage` (a `UsageSummary`), so a CI job without
access to the cluster plans with the Impact a reviewer would see live. A state saved before the key existed
still loads: its Impact says the usage is not in it. Without usage (none asked, none answered) the plan is
what it always was, and the Impact section says why it is missing.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from llmgw.cli.admin_client import AdminClient, AdminError
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.views import LiveState
from llmgw.core.plan.impact import NOT_IN_SAVED_STATE
from llmgw.core.traffic.usage_summary import UsageSummary

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog
    from llmgw.core.plan import Plan

__all__ = [
    "IMPACT_EXIT",
    "BadState",
    "ImpactExitOpt",
    "Usage",
    "WindowOpt",
    "exit_code",
    "fetch_usage",
    "read_state",
    "with_impact",
    "write_state",
]

IMPACT_EXIT = 3  # --impact-exitcode: a change loses traffic of the window (1 is an error, 2 changes)
USAGE_KEY = "usage"
Usage = UsageSummary | str  # the summary, or why there is none (said once, in the Impact section)
WindowOpt = Annotated[
    str,
    typer.Option(
        "--usage-window",
        help="Judge the changes against the traffic of this recent window (the Impact section; 0: none; "
        "with --state: the window the state was saved with)",
    ),
]
ImpactExitOpt = Annotated[
    bool,
    typer.Option(
        "--impact-exitcode",
        help="Exit 3 when a change would cut off, refuse or queue traffic of the usage window (before 2)",
    ),
]


class BadState(LlmgwError):
    """The saved state cannot be read; the message says where and what is expected."""


def fetch_usage(client: AdminClient, window: str) -> Usage | None:
    """The controller's usage summary of the last `window`; a reason instead when it cannot give one; None
    when none is asked for (a window of 0)."""
    if window.strip() == "0":
        return None
    path = "/api/v1/usage/summary?" + urllib.parse.urlencode({"window": window})
    try:
        return UsageSummary.model_validate(client.get(path))
    except AdminError as exc:
        if exc.status == 404:
            return "usage: this controller serves no usage summary (older than this llmgw); no Impact"
        if exc.status == 400:
            raise  # a bad --usage-window: the controller's words say what would be right
        return f"usage: the controller did not give a usage summary ({exc}); no Impact"
    except ValidationError as exc:
        return f"usage: the controller's usage summary is not one this llmgw reads ({_first(exc)}); no Impact"


def write_state(path: Path, live: LiveState, usage: Usage | None) -> None:
    body = json.loads(live.model_dump_json())
    if isinstance(usage, UsageSummary):
        body[USAGE_KEY] = usage.model_dump(mode="json")
    path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")


def read_state(path: Path) -> tuple[LiveState, Usage]:
    """The live state and the usage summary saved with it (or why there is none)."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadState(f"cannot read the saved live state {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise BadState(
            f"{path} is not a live state (write one with `llmgw plan --save-state FILE`): {exc}"
        ) from exc
    if not isinstance(body, dict):
        raise BadState(
            f"{path} is not a live state: expected a JSON object (from `llmgw plan --save-state FILE`)"
        )
    saved: Any = body.pop(USAGE_KEY, None)
    try:
        live = LiveState.model_validate(body)
    except ValidationError as exc:
        raise BadState(
            f"{path} is not a live state (write one with `llmgw plan --save-state FILE`): {_first(exc)}"
        ) from exc
    if saved is None:
        return live, NOT_IN_SAVED_STATE
    try:
        return live, UsageSummary.model_validate(saved)
    except ValidationError as exc:
        raise BadState(
            f"{path}: {USAGE_KEY}: not a usage summary: {_first(exc)} (save it again with `llmgw plan "
            "--save-state FILE`, or delete the key to plan without an Impact)"
        ) from exc


def with_impact(made: Plan, usage: Usage | None, catalog: Catalog, live: LiveState) -> Plan:
    from llmgw.core.plan import plan_impact, unknown_impact

    if usage is None:
        return made
    impact = unknown_impact(usage) if isinstance(usage, str) else plan_impact(made, usage, catalog, live)
    return dataclasses.replace(made, impact=impact)


def exit_code(made: Plan, *, detailed: bool, impact: bool) -> int:
    """3 for a loss under --impact-exitcode (it outranks 2: a reviewer must see it), else Terraform's."""
    from llmgw.core.plan import exit_code as plan_exit_code

    if impact and made.impact is not None and made.impact.losses:
        return IMPACT_EXIT
    return plan_exit_code(made) if detailed else 0


def _first(exc: ValidationError) -> str:
    e = exc.errors()[0]
    where = ".".join(str(p) for p in e["loc"]) or "(top)"
    return f"{where}: {e['msg']}"
