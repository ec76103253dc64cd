"""`llmgw usage`: requests, tokens and cost from the store (or the controller's admin API), grouped by project,
team, organization, key, model, router, person or a request tag; as a table, CSV or JSON.

The store is found as the other store commands find it (llmgw.cli.data.store_cmds, store_find).
"""

from __future__ import annotations

import csv
import sys
import time
import urllib.parse
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from llmgw.cli import output
from llmgw.cli.data.store_cmds import (
    ControllerConfigOpt,
    JsonOpt,
    StoreOpt,
    TokenFileOpt,
    admin_call,
    controller_client,
    run_on_store,
)
from llmgw.cli.data.store_find import StoreWhere
from llmgw.core.api.admin_api import UsageAnswer
from llmgw.core.words import count, duration_words, money, parse_duration
from llmgw.store import USAGE_GROUPS, UsageGroup, UsageTotal
from llmgw.store.records import TAG_GROUP_PREFIX

# How the table and CSV show what JSON gives as null: a request made without a key, and a key whose row
# is gone from api_keys (its name and project are unknown, which is not the same as empty).
NO_KEY = "(no key)"
KEY_NOT_IN_STORE = "(key not in store)"
UNKNOWN = "(unknown)"
UNTAGGED = "(untagged)"
NO_PERSON = "(no person)"  # by person: requests made with a project's key (or none), nobody's own


def _group_column(t: UsageTotal, by: str, tag: str | None, as_json: bool) -> str | None:
    """A group's name; by tag, the requests without the tag: null in JSON, (untagged) in a table or CSV; by
    person, the requests of no person's key: null in JSON, (no person) in a table or CSV."""
    if t.group or (tag is None and by != "person"):
        return t.group
    if as_json:
        return None
    return UNTAGGED if tag is not None else NO_PERSON


def _key_columns(t: UsageTotal, *, labelled: bool) -> list[str | None]:
    """key, name, project of a by-key total: JSON keeps nulls, the table and CSV say what they mean."""
    key_id = t.group or None
    if not labelled:
        return [key_id, t.key_name, t.key_project]
    if key_id is None:
        return [NO_KEY, "", ""]
    if t.key_name is None:
        return [key_id, KEY_NOT_IN_STORE, UNKNOWN]
    return [key_id, t.key_name, t.key_project]


def _plain(value: object) -> object:
    """A float as a plain decimal (no exponent); anything else as it is."""
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")
    return value


def _usage_totals(
    by: str, start: float | None, where: StoreWhere, controller: str | None, token_file: Path | None
) -> list[UsageTotal]:
    """From the store, or with --controller through the admin API's GET /api/v1/usage (an admin token)."""
    tag = by.removeprefix(TAG_GROUP_PREFIX) if by.startswith(TAG_GROUP_PREFIX) else None
    if controller is not None:
        output.console(stderr=True).print(f"usage from the controller at {controller}", highlight=False)
        query = {"by": by} | ({"since": repr(start)} if start is not None else {})
        path = "/api/v1/usage?" + urllib.parse.urlencode(query)
        data = admin_call(controller_client(controller, token_file), "GET", path, None, UsageAnswer)
        return [
            UsageTotal(
                t.group or "",
                t.requests,
                t.tokens_in,
                t.tokens_out,
                t.cost,
                t.avg_latency_ms,
                t.errors,
                key_name=t.key_name,
                key_project=t.key_project,
            )
            for t in data.totals
        ]
    if tag is not None:
        return run_on_store(where, lambda s: s.usage_totals_by_tag(tag, since=start))
    group: UsageGroup = by  # type: ignore[assignment]  # the caller checked it is one of USAGE_GROUPS
    return run_on_store(where, lambda s: s.usage_totals(group, since=start))


def usage(
    by: Annotated[
        str,
        typer.Option(
            "--by",
            help="Group by project, team, org, key, model, router (imported rows: import:SOURCE), person, "
            "or tag:KEY.",
        ),
    ] = "project",
    since: Annotated[str | None, typer.Option("--since", help="Only the last 7d, 24h, ...")] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV.")] = False,
    store: StoreOpt = None,
    controller_config: ControllerConfigOpt = None,
    controller: Annotated[
        str | None,
        typer.Option(
            "--controller", help="Ask this controller's admin API (an admin token) instead of a store"
        ),
    ] = None,
    token_file: TokenFileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Requests, tokens and cost, grouped (by key: with each key's name and project; with --by tag:KEY, by the value
    of that request tag, requests without it in one untagged group)."""
    tag = _usage_tag(by)
    start = _usage_start(since)
    totals = _usage_totals(by, start, StoreWhere(store, controller_config), controller, token_file)
    header, rows = _usage_rows(totals, by, tag, as_json)
    _print_usage(header, rows, totals, as_json=as_json, as_csv=as_csv)


def _usage_tag(by: str) -> str | None:
    """The tag key `--by tag:KEY` names, None for the other groups; an unknown group fails."""
    tag = by.removeprefix(TAG_GROUP_PREFIX) if by.startswith(TAG_GROUP_PREFIX) else None
    if tag is None and by not in USAGE_GROUPS:
        output.fail(f"--by {by!r}: expected one of {', '.join(USAGE_GROUPS)}, or tag:KEY (e.g. --by tag:app)")
    if tag is not None and not tag:
        output.fail("--by tag: names no tag key (e.g. --by tag:app)")
    return tag


def _usage_start(since: str | None) -> float | None:
    """When `--since` starts (None: no --since, every row counts)."""
    try:
        return time.time() - parse_duration(since, bare_seconds=False, positive=True) if since else None
    except ValueError as exc:
        output.fail(f"--since: {exc}")


def _usage_rows(
    totals: list[UsageTotal], by: str, tag: str | None, as_json: bool
) -> tuple[list[str], list[list[Any]]]:
    """The header and one row per group: the group's columns, then the numbers."""
    header = [
        *(["key", "name", "project"] if by == "key" else [by]),
        "requests",
        "errors",
        "tokens_in",
        "tokens_out",
        "cost",
        "avg_latency_ms",
    ]
    rows = [
        [
            *(_key_columns(t, labelled=not as_json) if by == "key" else [_group_column(t, by, tag, as_json)]),
            t.requests,
            t.errors,
            t.tokens_in,
            t.tokens_out,
            round(t.cost, 6),
            round(t.avg_latency_ms, 1),
        ]
        for t in totals
    ]
    return header, rows


def _print_usage(
    header: list[str], rows: list[list[Any]], totals: list[UsageTotal], *, as_json: bool, as_csv: bool
) -> None:
    """As JSON, as CSV, or as a table people read."""
    if as_json:
        output.print_json([dict(zip(header, r, strict=True)) for r in rows])
    elif as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(header)
        # Plain decimals: a spreadsheet reads `0.000001`; `1e-06` is what the issue tracker got pasted.
        writer.writerows([_plain(v) for v in r] for r in rows)
    else:
        table = Table(*header)
        labels = len(header) - 6  # the group's columns; then the numbers, printed as people read them
        for r, t in zip(rows, totals, strict=True):
            numbers = [
                count(t.requests),
                count(t.errors),
                count(t.tokens_in),
                count(t.tokens_out),
                money(t.cost),
            ]
            latency = duration_words(t.avg_latency_ms / 1000) if t.requests else "-"
            # A key's name is operator text, not markup.
            table.add_row(*(escape(str(v)) for v in r[:labels]), *numbers, latency)
        output.console().print(table)


def register(app: typer.Typer) -> None:
    app.command("usage")(usage)
