"""`llmgw facility hold|release|holds`: keep new replicas off a facility domain (a rack, a PDU, a row...) for
maintenance, through a running controller's admin API (scope `apply`; audited). A hold is kept by the
controller like a node drain, across its restarts; `--drain` moves the domain's replicas elsewhere too."""

from __future__ import annotations

import urllib.parse
from typing import Annotated

import typer

from llmgw.cli import output
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client

facility_app = typer.Typer(
    help="Hold facility domains (LEVEL=VALUE: site, room, row, rack, pdu) and release them",
    no_args_is_help=True,
)

DomainArg = Annotated[str, typer.Argument(help="The domain, LEVEL=VALUE (rack=r12, pdu=pdu-a1)")]


def register(app: typer.Typer) -> None:
    app.add_typer(facility_app, name="facility")
    facility_app.command("hold")(hold)
    facility_app.command("release")(release)
    facility_app.command("holds")(holds)


def _path(domain: str) -> str:
    return f"/api/v1/facility/holds/{urllib.parse.quote(domain, safe='=')}"


def hold(
    domain: DomainArg,
    drain: Annotated[bool, typer.Option("--drain", help="Move the domain's replicas elsewhere too")] = False,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Place nothing new on DOMAIN's nodes until `llmgw facility release DOMAIN`; with --drain, move what
    runs there elsewhere too, make-before-break (`llmgw explain MODEL` names the hold on each node)."""
    client = controller_client(controller, token_file)
    reply = client.post(_path(domain), {"drain": drain}, ok=(202,))[1]
    if as_json:
        output.print_json(reply)
        return
    nodes = ", ".join(reply["nodes"]) or "no node seen there yet"
    typer.echo(f"{domain} held ({nodes}).")
    if drain:
        typer.echo(f"Moving {len(reply['moving'])} replica(s) elsewhere.")


def release(
    domain: DomainArg,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Let DOMAIN's nodes take new replicas again (what moved away stays where it went)."""
    client = controller_client(controller, token_file)
    reply = client.post(_path(domain) + "/release", {}, ok=(200,))[1]
    if as_json:
        output.print_json(reply)
    elif reply["was_held"]:
        typer.echo(f"{domain} released: its nodes take new replicas again.")
    else:
        typer.echo(f"{domain} was not held.")


def holds(controller: ControllerOpt = None, token_file: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """The held domains: who held them and when, whether they drain, their nodes."""
    reply = controller_client(controller, token_file).get("/api/v1/facility/holds")
    if as_json:
        output.print_json(reply)
        return
    if not reply["holds"]:
        typer.echo("No facility domain is held.")
    for h in reply["holds"]:
        drain = ", draining" if h["drain"] else ""
        typer.echo(f"{h['domain']}{drain}: {h['words']} (nodes: {', '.join(h['nodes']) or 'none'})")
