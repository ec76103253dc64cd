"""`llmgw restart MODEL|REPLICA` and `llmgw node drain|uncordon NODE`: fleet operations through a running
controller's admin API (scope `apply`; each is audited). Both wait, printing progress, until the work is done
or `--timeout` passes (`--no-wait` returns once the controller has taken it).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from typing import Annotated, Any

import typer

from llmgw.cli import output
from llmgw.cli.admin_client import AdminClient, AdminError
from llmgw.cli.deploy.node_cmds import node_app
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client, fail
from llmgw.cli.repo.follow import EXIT_TIMEOUT

WaitOpt = Annotated[bool, typer.Option("--wait/--no-wait", help="Follow until done (default) or return")]
TimeoutOpt = Annotated[str, typer.Option("--timeout", help="How long to wait (e.g. 90s, 10m)")]


def register(app: typer.Typer) -> None:
    app.command("restart")(restart)
    node_app.command("drain")(drain)
    node_app.command("uncordon")(uncordon)


def _post(client: AdminClient, path: str, body: dict[str, Any]) -> Any:
    return client.post(path, body, ok=(200, 202))[1]


def _seconds(text: str) -> float:
    from llmgw.controller.parts.settings import SettingsError, setting_duration

    try:
        return setting_duration("--timeout", text)
    except SettingsError as exc:
        fail(str(exc))


def _poll(check: Callable[[], tuple[bool, str]], timeout_s: float, interval_s: float = 1.0) -> bool:
    """Call `check` until it says done or the deadline passes; print each new progress line."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            done, line = check()
        except AdminError as exc:
            done, line = False, f"(controller not answering: {exc})"
        if line != last:
            typer.echo(line)
            last = line
        if done:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def restart(
    target: Annotated[str, typer.Argument(help="A model (every replica of it) or one replica id")],
    max_surge: Annotated[
        int | None, typer.Option("--max-surge", min=0, help="Replicas started beside the old ones")
    ] = None,
    max_unavailable: Annotated[
        int | None, typer.Option("--max-unavailable", min=0, help="Ready replicas that may be missing")
    ] = None,
    wait: WaitOpt = True,
    timeout: TimeoutOpt = "10m",
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replace a model's replicas (or one replica), make-before-break: new ones ready before old ones stop.
    The pace defaults to the model's `rollout` block."""
    client = controller_client(controller, token_file)
    body = {"target": target, "max_surge": max_surge, "max_unavailable": max_unavailable}
    reply = _post(client, "/api/v1/restart", body)
    if as_json:
        output.print_json(reply)
    else:
        typer.echo(
            f"Restarting {len(reply['replicas'])} replica(s) of {reply['model']} (max_surge "
            f"{reply['max_surge']}, max_unavailable {reply['max_unavailable']})."
        )
    if not wait:
        return
    old = set(reply["replicas"])
    model = str(reply["model"])

    def check() -> tuple[bool, str]:
        items = client.get("/api/v1/replicas?" + urllib.parse.urlencode({"model": model}))["replicas"]
        left = sorted(r["id"] for r in items if r["id"] in old)
        ready = sum(1 for r in items if r["state"] == "ready" and r["id"] not in old)
        health: dict[str, Any] = next((m for m in client.status()["models"] if m["model"] == model), {})
        target_n = int(health.get("target", 0))
        done = not left and ready >= target_n
        return done, f"{model}: {len(old) - len(left)} of {len(old)} replaced, {ready}/{target_n} new ready"

    if not _poll(check, _seconds(timeout)):
        typer.echo(f"Timed out after {timeout} waiting for the restart of {model}.", err=True)
        raise typer.Exit(EXIT_TIMEOUT)
    typer.echo(f"{model} restarted.")


def drain(
    node: Annotated[str, typer.Argument(help="The node to drain")],
    wait: WaitOpt = True,
    timeout: TimeoutOpt = "10m",
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cordon NODE and move its replicas elsewhere, make-before-break (each stops once its replacement is
    ready); one nothing can replace keeps serving, and the wait says so. `llmgw node uncordon` undoes it."""
    client = controller_client(controller, token_file)
    reply = _post(client, f"/api/v1/nodes/{urllib.parse.quote(node)}/drain", {})
    if as_json:
        output.print_json(reply)
    else:
        typer.echo(f"Node {node} cordoned; moving {len(reply['moving'])} replica(s) elsewhere.")
    if not wait:
        return

    def check() -> tuple[bool, str]:
        nodes = client.get("/api/v1/nodes")["nodes"]
        here = next((n for n in nodes if n["name"] == node), None)
        left = list(here["replicas"]) if here else []
        return not left, f"{node}: {len(left)} replica(s) left" + (f" ({', '.join(left)})" if left else "")

    if not _poll(check, _seconds(timeout)):
        typer.echo(
            f"Timed out after {timeout}: replicas are still on {node} (their replacements cannot be placed "
            "or are not ready yet: see `llmgw status` and `llmgw explain MODEL`).",
            err=True,
        )
        raise typer.Exit(EXIT_TIMEOUT)
    typer.echo(f"Node {node} is drained: no replica runs there and nothing new is placed there.")


def uncordon(
    node: Annotated[str, typer.Argument(help="The node to take new replicas again")],
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Let NODE take new replicas again after a drain (what moved away stays where it went)."""
    client = controller_client(controller, token_file)
    reply = _post(client, f"/api/v1/nodes/{urllib.parse.quote(node)}/uncordon", {})
    if as_json:
        output.print_json(reply)
        return
    if reply.get("cordoned_in_repo"):
        typer.echo(f"Node {node} is no longer drained, but the repo still cordons it (spec.cordoned: true).")
    else:
        typer.echo(f"Node {node} takes new replicas again.")
