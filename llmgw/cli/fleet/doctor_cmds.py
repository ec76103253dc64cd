"""`llmgw doctor [NODE]`: checks the controller side, or asks one node's agent to check itself, and says what
to fix. Exit status 1 when a check fails (a warning alone exits 0), so a script or a CI job can gate on it."""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Any

import typer
from rich.markup import escape

from llmgw.cli import output
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client

MARK = {"ok": "[green]ok  [/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]fail[/red]"}
# A node's checks run engine probes (30s each at most, by the agent): wait longer than the admin client's default.
NODE_TIMEOUT_S = 180.0


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    node: Annotated[
        str | None,
        typer.Argument(help="A node to check (its agent checks itself); none: the controller side"),
    ] = None,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Health checks, each ok, warn or fail with what to fix.

    Without NODE: the store, the cluster repo, the certificates the controller uses, routers and agents. With
    NODE: the GPU driver, each installed engine's probe, free space for weights, the clock against the
    controller's, every controller address from the node, the node's certificate."""
    client = controller_client(controller, token_file)
    if node is None:
        answer = client.get("/api/v1/doctor")
    else:
        client.timeout_s = NODE_TIMEOUT_S
        _, answer = client.post(f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}/doctor", {})
    if as_json:
        output.print_json(answer)
    else:
        _print(answer)
    if answer.get("status") == "fail":
        raise typer.Exit(1)


def _print(answer: dict[str, Any]) -> None:
    console = output.console()
    subject = answer.get("subject", "?")
    version = f" (agent {answer['agent_version']})" if answer.get("agent_version") else ""
    console.print(f"[bold]{escape(subject)}[/bold]{escape(version)}", highlight=False)
    for check in answer.get("checks", []):
        line = f"  {MARK.get(check['status'], check['status'])} {escape(check['name'])}: {escape(check['message'])}"
        console.print(line, highlight=False, soft_wrap=True)
        if check.get("fix") and check["status"] != "ok":
            console.print(f"       fix: {escape(check['fix'])}", highlight=False, soft_wrap=True)
    worst = answer.get("status", "ok")
    counts = {s: sum(1 for c in answer.get("checks", []) if c["status"] == s) for s in ("ok", "warn", "fail")}
    words = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    console.print(f"{MARK.get(worst, worst)} {escape(subject)}: {words}", highlight=False)
