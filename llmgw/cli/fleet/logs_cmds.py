"""`llmgw logs NODE|REPLICA` (engine output and agent lines, from the agents' rings through the controller) and
`llmgw events` (what the controller did), read through a running controller's admin API.

`llmgw logs` prints one line per log line, `TIME NODE SOURCE: TEXT` (SOURCE is the replica id, with `/RANK` for
a shard past the first, or `agent`); `--json` prints each as one JSON object per line instead. `-f` keeps the
stream open (and reconnects with its cursor when the controller restarts) until interrupted.
"""

from __future__ import annotations

import time
import urllib.parse
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from llmgw.cli import output
from llmgw.cli.admin_client import AdminClient, AdminError
from llmgw.cli.reach import ControllerOpt, TokenOpt, controller_client, fail
from llmgw.core.api.admin_api import EventsAnswer
from llmgw.core.words import parse_duration

PAGE = 1000  # the admin API's largest page
RECONNECT_S = 1.0


def register(app: typer.Typer) -> None:
    app.command("logs")(logs)
    app.command("events")(events)


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def line_words(line: dict[str, Any]) -> str:
    source = str(line.get("source") or "?")
    if line.get("shard"):
        source += f"/{line['shard']}"
    return f"{_stamp(float(line['time']))} {line.get('node', '?')} {source}: {line.get('text', '')}"


def _show(line: dict[str, Any], as_json: bool) -> None:
    if as_json:
        output.print_json_line(line)
    else:
        typer.echo(line_words(line))


def _note(message: str) -> None:
    output.console(stderr=True).print(f"[yellow]{message}[/yellow]", highlight=False, markup=False)


def logs_path(client: AdminClient, target: str) -> str:
    """A node's logs when TARGET names a node the controller knows, else the replica's."""
    nodes = {n["name"] for n in client.get("/api/v1/nodes")["nodes"]}
    kind = "nodes" if target in nodes else "replicas"
    return f"/api/v1/{kind}/{urllib.parse.quote(target, safe='')}/logs"


def logs(
    target: Annotated[
        str, typer.Argument(help="A node name or a replica id (see llmgw nodes, llmgw replicas)")
    ],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing new lines until interrupted.")
    ] = False,
    since: Annotated[str | None, typer.Option("--since", help="Lines of the last 10m, 2h, 1d ...")] = None,
    grep: Annotated[
        str | None, typer.Option("--grep", help="Only lines matching this regular expression.")
    ] = None,
    source: Annotated[
        str | None, typer.Option("--source", help="Of a node: only this replica's lines, or `agent`.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", help="At most this many lines (the newest, or the first --since).")
    ] = 200,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: output.JsonOpt = False,
) -> None:
    """Engine output and the agent's own lines, from the node's ring (redacted on the node)."""
    if since is not None:
        try:
            parse_duration(since, bare_seconds=False, positive=True)
        except ValueError as exc:
            fail(f"--since {since!r}: {exc}")
    if limit < 1:
        fail(f"--limit {limit}: at least 1")
    client = controller_client(controller, token_file)
    path = logs_path(client, target)
    query = {k: v for k, v in {"since": since, "grep": grep, "source": source}.items() if v}
    try:
        if follow:
            _follow(client, path, {**query, "limit": str(min(limit, PAGE))}, as_json)
        else:
            _pages(client, path, query, limit, as_json)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _pages(client: AdminClient, path: str, query: dict[str, str], limit: int, as_json: bool) -> None:
    """The newest `limit` lines; with --since, the first `limit` from then on, a page at a time."""
    printed, cursor = 0, None
    while printed < limit:
        ask = {**query, "limit": str(min(limit - printed, PAGE))} | ({"cursor": cursor} if cursor else {})
        page = client.get(path + "?" + urllib.parse.urlencode(ask))
        for node, why in (page.get("unavailable") or {}).items():
            _note(f"node {node}: {why}")
        if page.get("missed"):
            _note(f"{page['missed']} line(s) had left the ring before they were read")
        for line in page["lines"]:
            _show(line, as_json)
        printed += len(page["lines"])
        cursor = page["next_cursor"]
        if "since" not in query or not page["more"] or not page["lines"]:
            return


def _follow(client: AdminClient, path: str, query: dict[str, str], as_json: bool) -> None:
    cursor: str | None = None
    lost = False
    while True:
        ask = query | ({"cursor": cursor, "follow": "1"} if cursor else {"follow": "1"})
        try:
            for item in client.stream(path + "?" + urllib.parse.urlencode(ask)):
                if lost:
                    _note("the controller answers again")
                    lost = False
                if "line" in item:
                    _show(item["line"], as_json)
                elif "cursor" in item:
                    cursor = item["cursor"]
                elif "notice" in item:
                    _note(str(item["notice"]))
        except AdminError as exc:
            if cursor is None or exc.status is not None:  # never connected, or refused: nothing to wait for
                raise
            if not lost:
                _note(f"{exc}; reconnecting")
                lost = True
        time.sleep(RECONNECT_S)


def events(
    limit: Annotated[
        int, typer.Option("--limit", "-n", help="At most this many (1-1000), newest first.")
    ] = 100,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: output.JsonOpt = False,
) -> None:
    """What the controller did and saw, newest first: revisions, replicas started, failed, stopped."""
    data = controller_client(controller, token_file).get_as(f"/api/v1/events?limit={limit}", EventsAnswer)
    if as_json:
        output.print_json(data.model_dump(mode="json"))
        return
    table = Table("TIME (UTC)", "KIND", "OBJECT", "MESSAGE")
    for e in data.events:
        table.add_row(_stamp(e.time)[:-4], e.kind, Text(e.object), Text(e.message))
    output.console().print(table)
