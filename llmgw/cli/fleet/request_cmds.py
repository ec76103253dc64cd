"""`llmgw request ID`: one request end to end — its usage row, the endpoint that served it, the queue time,
the time to first token, the duration, tokens and cost, the endpoints that failed first, the scheduling
decision (candidates, scores, the winner) and its tags.

Through the controller's admin API (`GET /api/v1/requests/ID`, an `admin` token), which reads the store every
router writes; or, with `--router URL` (a router's metrics listener), from that router's own buffer of the
last requests it finished: those made without a project's key have no usage row, and a row reaches the store
about a second after the answer.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from llmgw.cli import output
from llmgw.cli.fleet.request_bodies import show_body, show_replay
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client, fail
from llmgw.core.words import count, duration_words, money

__all__ = ["register", "request"]


def register(app: typer.Typer) -> None:
    app.command("request")(request)


def _ms(value: float | None) -> str:
    """A time in milliseconds as people read it; `-` when not known (never 0 for unknown)."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f} ms"
    if value < 1000:
        return f"{value:.0f} ms"
    return duration_words(value / 1000)


ROUTER_TOKEN_ENV = "LLMGW_ROUTER_TOKEN"


def _router_token(path: Path | None) -> str:
    """The router's operator token (`llmgw-router --operator-token-file`): from the file, else the
    environment; never the admin token, which is the controller's and must not go to a router."""
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read --router-token-file {path}: {exc}")
        if not token:
            fail(f"--router-token-file {path} is empty: it should hold the router's operator token")
        return token
    token = os.environ.get(ROUTER_TOKEN_ENV, "").strip()
    if not token:
        fail(
            f"--router needs the router's operator token: give --router-token-file FILE or set "
            f"{ROUTER_TOKEN_ENV} (the router's --operator-token-file)"
        )
    return token


def _from_router(url: str, request_id: str, token: str) -> Any:
    target = url.rstrip("/") + "/requests/" + urllib.parse.quote(request_id, safe="")
    ask = urllib.request.Request(target, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(ask, timeout=10) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            fail(f"router {url} refused the lookup ({exc.code}): it needs its --operator-token-file token")
        fail(f"router {url}: {exc}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        fail(f"router {url}: {exc} (--router is the router's metrics listener, e.g. http://127.0.0.1:9091)")


def _decision_table(decision: dict[str, Any]) -> Table:
    candidates = decision.get("candidates") or []
    scorers = sorted({k for c in candidates for k in c.get("scores", {})})
    table = Table("candidate", "total", *scorers, "")
    for c in candidates:
        won = "[green]picked[/green]" if c.get("id") == decision.get("endpoint") else ""
        scores = [f"{c['scores'][s]:.3g}" if s in c.get("scores", {}) else "-" for s in scorers]
        table.add_row(escape(str(c.get("id"))), f"{c.get('total', 0):.3g}", *scores, won)
    return table


def _cache_hit(r: dict[str, Any]) -> bool:
    decision = r.get("decision")
    return isinstance(decision, dict) and decision.get("cache") == "hit"


def _show(r: dict[str, Any]) -> None:
    console = output.console()
    when = datetime.fromtimestamp(r["time"], UTC).strftime("%Y-%m-%d %H:%M:%S")
    router = f", router {r['router_id']}" if r.get("router_id") else ""
    console.print(
        f"[bold]request {escape(r['request_id'])}[/bold]  {when} UTC{escape(router)}", highlight=False
    )
    status = str(r["status"]) + (f" {r['code']}" if r.get("code") else "")
    tenant = r.get("project") or "(no project)"
    parents = ", ".join(f"{k} {r[k]}" for k in ("team", "org") if r.get(k))
    lines = [
        ("status", status),
        (
            "project",
            tenant
            + (f" ({parents})" if parents else "")
            + (f", key {r['key_id']}" if r.get("key_id") else ""),
        ),
        ("model", r["model"] + ("  (a fallback)" if r.get("fallback_used") else "")),
        ("endpoint", r.get("endpoint") or ("(the response cache)" if _cache_hit(r) else "(none picked)")),
        ("queue", _ms(r.get("queue_ms"))),
        ("first token", _ms(r.get("ttft_ms")) + ("" if r.get("ttft_ms") is not None else " (not streamed)")),
        ("duration", _ms(r.get("duration_ms"))),
        ("tokens", f"{count(r['tokens_in'])} in, {count(r['tokens_out'])} out"),
        ("cost", money(r["cost"])),
    ]
    for attempt in r.get("attempts") or []:
        lines.append(
            ("failed first", f"{attempt.get('endpoint')} ({attempt.get('model')}): {attempt.get('reason')}")
        )
    if r.get("tags"):
        lines.append(("tags", ", ".join(f"{k}={v}" for k, v in sorted(r["tags"].items()))))
    for stage, verdict in (r.get("guard") or {}).items():  # the guardrails' verdicts (docs/guardrails.md)
        rules = ", ".join([*verdict.get("rules", []), *verdict.get("hazards", [])])
        lines.append((f"guard {stage}", f"{verdict.get('action')}" + (f": {rules}" if rules else "")))
    if isinstance(r.get("decision"), dict) and r["decision"].get("adapter"):  # llmgw_router.path.lora
        lines.append(("adapter", f"{r['decision']['adapter']} (LoRA on {r.get('model')})"))
    for label, value in lines:
        console.print(f"  {label:<14}{escape(str(value))}", highlight=False)
    decision = r.get("decision")
    if isinstance(decision, dict) and _cache_hit(r):  # llmgw_router.path.cache
        console.print(
            f"  {'decision':<14}answered from the router's response cache "
            f"(stored {escape(str(decision.get('age_s')))}s before)",
            highlight=False,
        )
    elif isinstance(decision, dict):
        dropped = ", ".join(f"{k} {v}" for k, v in (decision.get("dropped") or {}).items())
        console.print(
            f"  {'decision':<14}{escape(str(decision.get('picker')))} picked "
            f"{escape(str(decision.get('endpoint')))} (decided by {escape(str(decision.get('by')))})"
            + (f"; filtered out: {escape(dropped)}" if dropped else ""),
            highlight=False,
        )
        console.print(_decision_table(decision))
    else:
        console.print(f"  {'decision':<14}(none: refused before an endpoint was picked)", highlight=False)


def request(
    request_id: Annotated[
        str, typer.Argument(help="The request's id (the x-request-id header of its answer).")
    ],
    router: Annotated[
        str | None,
        typer.Option(
            "--router", help="Ask this router's metrics listener (its buffer of the last requests)."
        ),
    ] = None,
    router_token_file: Annotated[
        Path | None,
        typer.Option(
            "--router-token-file",
            help=f"With --router: file holding the router's operator token (env {ROUTER_TOKEN_ENV})",
        ),
    ] = None,
    body: Annotated[
        bool,
        typer.Option(
            "--body", help="Show its kept request and answer bodies (a project's retention.bodies)."
        ),
    ] = False,
    replay: Annotated[
        str | None,
        typer.Option(
            "--replay",
            metavar="MODEL",
            help="Send its kept request to MODEL and show the two answers side by side.",
        ),
    ] = None,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One request end to end: status, endpoint, queue time, first token, duration, tokens, cost, the
    endpoints that failed first, the scheduling decision and its tags; with --body its kept bodies, with
    --replay MODEL its kept request answered again by MODEL."""
    if (body or replay is not None) and router is not None:
        fail("--body and --replay read the kept bodies through the controller: leave out --router")
    if replay is not None:
        show_replay(controller_client(controller, token_file), request_id, replay, as_json)
        return
    if body:
        show_body(controller_client(controller, token_file), request_id, as_json)
        return
    if router is not None:
        found = _from_router(router, request_id, _router_token(router_token_file))["requests"]
        if not found:
            fail(f"router {router} has no request {request_id!r} in its buffer of the last requests")
    else:
        path = "/api/v1/requests/" + urllib.parse.quote(request_id, safe="")
        found = controller_client(controller, token_file).get(path)["requests"]
    if as_json:
        output.print_json(found)
        return
    for i, row in enumerate(found):
        if i:
            output.console().print()
        _show(row)
