"""`llmgw request ID --body` and `--replay MODEL` (docs/tenancy.md, Bodies kept and replayed): a request's kept
bodies, and the kept request sent to another model with the two answers side by side. Through the controller's
admin API (`GET /api/v1/requests/ID/body`, `POST /api/v1/requests/ID/replay`), which opens the content vault."""

from __future__ import annotations

import urllib.parse
from typing import Any

from rich.markup import escape
from rich.table import Table

from llmgw.cli import output
from llmgw.cli.admin_client import AdminClient

__all__ = ["show_body", "show_replay"]


def _path(request_id: str, what: str) -> str:
    return "/api/v1/requests/" + urllib.parse.quote(request_id, safe="") + "/" + what


def _cut(flag: Any) -> str:
    return "  (cut at the project's max_bytes)" if flag else ""


def show_body(client: AdminClient, request_id: str, as_json: bool) -> None:
    kept = client.get(_path(request_id, "body"))
    if as_json:
        output.print_json(kept)
        return
    console = output.console()
    served = kept.get("served") or "(none)"
    console.print(
        f"[bold]request {escape(kept['request_id'])}[/bold]  project {escape(kept['project'])}, model "
        f"{escape(kept['model'])}, served by {escape(served)}, status {kept['status']}"
        + (", redacted" if kept.get("redacted") else ", not redacted"),
        highlight=False,
    )
    console.print(f"[bold]request body[/bold]{_cut(kept.get('request_cut'))}", highlight=False)
    console.print(escape(kept["request"]), highlight=False, soft_wrap=True)
    streamed = " (streamed)" if kept.get("stream") else ""
    console.print(f"[bold]answer body[/bold]{streamed}{_cut(kept.get('answer_cut'))}", highlight=False)
    console.print(escape(kept.get("answer") or "(none)"), highlight=False, soft_wrap=True)


def show_replay(client: AdminClient, request_id: str, model: str, as_json: bool) -> None:
    _, found = client.post(_path(request_id, "replay"), {"model": model})
    if as_json:
        output.print_json(found)
        return
    original, replay = found["original"], found["replay"]
    first = original.get("served") or original["model"]
    table = Table(f"{first} (kept)", f"{replay['model']} (replayed on {replay['replica']})", show_lines=True)
    again = replay.get("answer_text")
    if again is None:
        again = f"(no answer: {replay.get('error') or 'it holds no text'})"
    table.add_row(escape(original.get("answer_text") or "(no text kept)"), escape(again))
    output.console().print(f"[bold]request {escape(request_id)}[/bold] replayed on {escape(model)}")
    output.console().print(table)
