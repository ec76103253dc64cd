"""`llmgw upgrade`: roll a new agent version across the nodes bootstrapped over SSH, a node (or N) at a time.

The controller does the work (`POST /api/v1/upgrade`, llmgw.controller.api.upgrades) and answers once every node is
done or the first one failed; this prints what happened to each node. Exit status 1 when a node failed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from llmgw.cli import output
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client

# A node's upgrade waits up to the controller's node_register_timeout_s (120s) for its agent, twice on a rollback;
# the HTTP request waits for the whole run.
TIMEOUT_S = 3600.0
WHEELHOUSE_HELP = (
    "A prebuilt agent wheelhouse directory on the controller's machine "
    "(default: built from the agent source beside the controller)"
)
MARK = {
    "upgraded": "[green]upgraded[/green]",
    "unchanged": "unchanged",
    "failed": "[red]failed[/red]",
    "not_managed": "[yellow]skipped[/yellow]",
    "not_attempted": "[yellow]not attempted[/yellow]",
}


ControlPlaneOpt = Annotated[
    bool,
    typer.Option(
        "--control-plane", help="Upgrade the controllers and routers of --plan instead of the agents"
    ),
]
PlanOpt = Annotated[
    Path | None, typer.Option("--plan", help="With --control-plane: the control plane's plan file")
]
ToOpt = Annotated[str | None, typer.Option("--to", help="With --control-plane: the release to move to")]
RollbackOpt = Annotated[
    bool, typer.Option("--rollback", help="With --control-plane: back to the release before")
]
AllowIrreversibleOpt = Annotated[
    bool,
    typer.Option(
        "--allow-irreversible", help="With --control-plane: cross store migrations that cannot be undone"
    ),
]


def register(app: typer.Typer) -> None:
    app.command("upgrade")(upgrade)


def upgrade(
    nodes: Annotated[
        str | None, typer.Option(help="Comma-separated node names (default: every node)")
    ] = None,
    parallel: Annotated[int, typer.Option(min=1, help="Nodes upgraded at a time")] = 1,
    wheelhouse: Annotated[Path | None, typer.Option(help=WHEELHOUSE_HELP)] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            min=1, max=3600, help="Seconds to wait for each agent to come back (default: the controller's)"
        ),
    ] = None,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
    control_plane: ControlPlaneOpt = False,
    plan: PlanOpt = None,
    to: ToOpt = None,
    rollback: RollbackOpt = False,
    allow_irreversible: AllowIrreversibleOpt = False,
) -> None:
    """Install a new agent on each node beside the old, switch, restart the agent only, and wait until it is
    back Ready with its engines adopted; stop at the first node that fails, leaving it on its old version.
    With --control-plane: roll the controllers (standbys, then the leader) and the routers (one at a time)
    of --plan onto --to RELEASE, or back with --rollback (docs/operations.md)."""
    if control_plane or rollback or to is not None:
        if not control_plane or plan is None:
            output.fail("--to and --rollback are for --control-plane, which needs --plan FILE")
        from llmgw.cli.deploy import control_plane as cp

        cp.run(plan, to, rollback=rollback, allow_irreversible=allow_irreversible)
        return
    body: dict[str, Any] = {"parallel": parallel}
    if nodes:
        body["nodes"] = [n.strip() for n in nodes.split(",") if n.strip()]
    if wheelhouse is not None:
        body["wheelhouse"] = str(wheelhouse.resolve())
    if timeout is not None:
        body["timeout_s"] = timeout
    client = controller_client(controller, token_file)
    client.timeout_s = TIMEOUT_S
    _, answer = client.post("/api/v1/upgrade", body)
    if as_json:
        output.print_json(answer)
    else:
        print_answer(answer)
    if not answer.get("ok"):
        raise typer.Exit(1)


def print_answer(answer: dict[str, Any]) -> None:
    console = output.console()
    version = f"llmgw-agent {answer.get('agent_version')} (wheelhouse {str(answer.get('wheelhouse'))[:12]})"
    console.print(f"upgrading to {escape(version)}", highlight=False)
    for n in answer.get("nodes", []):
        mark = MARK.get(n["status"], escape(n["status"]))
        console.print(f"{escape(n['node'])}: {mark}: {escape(n['message'])}", highlight=False)
        if n["status"] == "failed":
            for s in n.get("steps", []):
                if s["status"] != "skipped":
                    console.print(
                        f"    {escape(s['step'])}: {s['status']} {escape(s['detail'])}", highlight=False
                    )
