"""Where the CLI prints: a terminal gets rich's layout at its width; a pipe or a CI log gets every column whole.

Off a terminal rich assumes 80 columns and cuts cells with "…", so replica ids and engine names lose the part
that tells them apart, and a table pasted into an issue or grepped in a CI log is useless. There is no screen
to fit there, so the width is unbounded and each table takes its natural width.

Every list command takes `--json` (`JsonOpt`) and prints through `print_json`: one JSON document, the admin
API's answer as it came (or the store's rows), indented and with sorted keys so that it diffs well. A stream
(`llmgw logs`) prints one JSON object per line instead (`print_json_line`), so that it can be piped as it comes.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["HEALTH_STYLE", "WIDE", "JsonOpt", "console", "fail", "print_json", "print_json_line"]

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

WIDE = 100_000  # columns off a terminal: wider than any table, so none is cut

# A model's health (Argo CD's words, controller/status/fleet.py `health_word`) as every command colours it.
HEALTH_STYLE = {
    "Healthy": "green",
    "Progressing": "yellow",
    "Degraded": "red",
    "Missing": "red",
    "Unknown": "dim",
}


def console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=WIDE)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def print_json_line(data: Any) -> None:
    typer.echo(json.dumps(data, sort_keys=True, separators=(",", ":")))


def fail(message: str, details: tuple[str, ...] | list[str] = ()) -> NoReturn:
    """Stop the command: `error: MESSAGE` (and each detail line) on stderr, exit code 1."""
    err = console(stderr=True)
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    for line in details:
        err.print(f"  {escape(line)}", highlight=False)
    raise typer.Exit(1)
