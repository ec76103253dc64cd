"""`llmgw audit` and `llmgw notifications`: who changed what, and what the webhooks still owe, read through a
running controller's admin API (a `plan`-scope token is enough)."""

from __future__ import annotations

import time
import urllib.parse
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from llmgw.cli import output
from llmgw.cli.reach import (
    ControllerOpt,
    JsonOpt,
    TokenOpt,
    controller_client,
    fail,
)
from llmgw.core.api.admin_api import AuditAnswer
from llmgw.core.words import parse_duration


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)
    app.command("notifications")(notifications)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def audit(
    since: Annotated[str | None, typer.Option("--since", help="Only the last 1d, 6h, 30m ...")] = None,
    actor: Annotated[
        str | None, typer.Option("--actor", help="Only this actor (an admin token's name).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many entries (1-1000).")] = 200,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The audit log, newest first: every change made through the admin API, accepted or refused, by whom."""
    query: dict[str, str] = {"limit": str(limit)}
    if since is not None:
        try:
            query["since"] = repr(time.time() - parse_duration(since))
        except ValueError as exc:
            fail(f"--since {since!r}: {exc} (e.g. --since 1d, 6h, 30m)")
    if actor:
        query["actor"] = actor
    path = "/api/v1/audit?" + urllib.parse.urlencode(query)
    data = controller_client(controller, token_file).get_as(path, AuditAnswer)
    if as_json:
        output.print_json([e.model_dump(mode="json") for e in data.entries])
        return
    table = Table("Time (UTC)", "Actor", "Action", "Object", "Outcome", "Reason / detail")
    for e in data.entries:
        outcome = "[green]accepted[/green]" if e.outcome == "accepted" else "[red]refused[/red]"
        actor_text = e.actor + (f" ({e.actor_detail})" if e.actor_detail else "")
        table.add_row(_when(e.time), actor_text, e.action, e.object, outcome, e.reason or e.via)
    console = output.console()
    console.print(table)
    if data.unwritten:
        console.print(
            f"[yellow]{data.unwritten} entries not yet written to the store (it is retried)[/yellow]"
        )


def notifications(
    dead: Annotated[
        bool, typer.Option("--dead", help="Only dead letters (deliveries that gave up).")
    ] = False,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Webhook deliveries still owed (waiting or backing off) and dead letters, oldest first."""
    path = "/api/v1/notifications" + ("?dead=1" if dead else "")
    data = controller_client(controller, token_file).get(path)
    if as_json:
        output.print_json(data)
        return
    table = Table("Created (UTC)", "Notification", "Event", "Object", "Attempts", "State", "Last error")
    for d in data["deliveries"]:
        state = f"[red]dead {_when(d['dead_at'])}[/red]" if d["dead_at"] else f"next {_when(d['next_at'])}"
        table.add_row(
            _when(d["created_at"]),
            d["notification"],
            d["event"],
            d["object"],
            str(d["attempts"]),
            state,
            d["last_error"],
        )
    console = output.console()
    console.print(table)
    console.print(f"{data['waiting']} waiting, {data['dead']} dead", highlight=False)
