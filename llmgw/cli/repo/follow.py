"""`llmgw apply --wait`: follow an applied revision until Synced and Healthy, Degraded, or the timeout.

`progress(status, revision, ...)` is pure (the controller's `/api/v1/status` body in, a verdict out); the loop
around it polls, draws (a rich Live table on a terminal, plain lines when not) and, when it does not end well,
says what is missing: which models are not Healthy and why, from the status and `/api/v1/explain`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import typer

from llmgw.cli.admin_client import AdminClient, AdminError
from llmgw.cli.output import HEALTH_STYLE
from llmgw.core.words import short

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_TIMEOUT = 124  # as timeout(1): the fleet may still get there


@dataclass(frozen=True, slots=True)
class ModelLine:
    """One model's progress: what `apply --wait` judges and `llmgw up` prints (a new line when it changes)."""

    name: str
    health: str
    ready: int
    target: int
    detail: str = ""  # what the replicas that are not ready are doing ("1 starting", "fetching weights: 40%")

    def render(self) -> str:
        tail = f" ({self.detail})" if self.detail else ""
        return f"model {self.name}: {self.health}, {self.ready}/{self.target} ready{tail}"


@dataclass(frozen=True, slots=True)
class Progress:
    phase: Literal["waiting", "done", "failed"]
    applied: str | None
    sync: str
    models: tuple[ModelLine, ...]
    why: tuple[str, ...]  # what is missing (waiting) or what went wrong (failed)

    @property
    def degraded(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models if m.health == "Degraded")

    def line(self) -> str:
        """One plain line: what a log of a CI job shows."""
        models = (
            ", ".join(
                f"{m.name} {m.health} {m.ready}/{m.target}" + (f" {m.detail}" if m.detail else "")
                for m in self.models
            )
            or "no models"
        )
        return f"{self.sync}, applied {short(self.applied)}; {models}"


def progress(status: dict[str, Any], revision: str, *, was_applied: bool) -> Progress:
    """Where the revision is, from one status body. `was_applied`: it was applied at an earlier poll."""
    applied = (status.get("applied") or {}).get("revision")
    sync = str(status.get("sync") or "Unknown")
    models = tuple(
        ModelLine(
            str(m["model"]),
            str(m["health"]),
            int(m.get("ready", 0)),
            int(m.get("target", 0)),
            "rolling" if m.get("rolling") else "",
        )
        for m in status.get("models") or []
    )
    refused = status.get("refused") or {}
    if refused.get("revision") == revision:
        errors = tuple(str(e) for e in refused.get("errors") or [])
        return Progress("failed", applied, sync, models, (f"revision {short(revision)} refused:", *errors))
    if applied != revision:
        if was_applied:
            seen = (status.get("seen") or {}).get("source") or "another source"
            why = f"revision {short(revision)} was replaced by {short(applied)} (from {seen})"
            return Progress("failed", applied, sync, models, (why,))
        return Progress("waiting", applied, sync, (), (f"revision {short(revision)} is not applied yet",))
    seen = status.get("seen") or {}
    missing = []
    if sync != "Synced":
        missing.append(
            f"sync is {sync}: the controller's source ({seen.get('source', 'unknown')}) is at "
            f"{short(seen.get('revision'))}, applied is {short(applied)}"
        )
    missing += [
        f"model {m.name} is {m.health} ({m.ready}/{m.target} ready{', rolling' if m.detail else ''})"
        for m in models
        if m.health != "Healthy"
    ]
    return Progress("done" if not missing else "waiting", applied, sync, models, tuple(missing))


def give_up(p: Progress, since: dict[str, float], now: float, grace_s: float) -> Progress:
    """`p`, failed when a model has been Degraded for `grace_s` or more. `since` (model -> when it turned
    Degraded) is updated: a start that failed once is retried by the controller, so one Degraded poll is not
    yet a verdict; one that stays Degraded is."""
    for name in [n for n in since if n not in p.degraded]:
        del since[name]
    for name in p.degraded:
        since.setdefault(name, now)
    stuck = {n for n in p.degraded if now - since[n] >= grace_s}
    if p.phase != "waiting" or not stuck:
        return p
    why = tuple(
        f"model {m.name} is Degraded ({m.ready}/{m.target} ready)" for m in p.models if m.name in stuck
    )
    return replace(p, phase="failed", why=why)


def explain_lines(client: AdminClient, status: dict[str, Any]) -> list[str]:
    """Why each model that is not Healthy is not: unplaceable node reasons, failed replicas, backoff."""
    out: list[str] = []
    for m in status.get("models") or []:
        if m.get("health") == "Healthy":
            continue
        name = str(m["model"])
        out.append(f"{name}: {m['health']}, {m.get('ready', 0)} of {m.get('target', 0)} replicas ready")
        if m.get("failures"):
            out.append(f"  {m['failures']} failed start(s); retrying with backoff")
        for node, reason in sorted((m.get("unplaceable") or {}).items()):
            out.append(f"  cannot place on {node}: {reason}")
        try:
            found = client.explain(name)
            replicas = client.get(f"/api/v1/replicas?model={name}").get("replicas", [])
        except AdminError as exc:
            out.append(f"  (could not ask the controller why: {exc})")
            continue
        if found and found.get("problem"):
            out.append(f"  {found['problem']}")
        # The node reasons, unless the status already gave them.
        shown = bool(m.get("unplaceable"))
        for p in (
            found.get("profiles", []) if found and not shown and found.get("would_place") is None else []
        ):
            out.append(f"  profile {p['profile']}: {p['summary']}")
            out += [f"    {n['node']}: {n['words']}" for n in p["nodes"] if not n["accepted"]]
        for r in replicas:
            if r.get("state") in ("failed", "lost", "unknown"):
                out.append(
                    f"  replica {r['id']} on {r.get('node')}: {r['state']} {r.get('error') or ''}".rstrip()
                )
                tail = r.get("last_output_lines")
                if tail is None:  # engine output can carry prompts: an admin-scope token sees it
                    out.append(f"    (its output: llmgw logs {r['id']}, with an admin-scope token)")
                out += [f"    | {line}" for line in tail or []]
    return out


def follow(
    client: AdminClient,
    revision: str,
    timeout_s: float,
    interval_s: float,
    tty: bool,
    degraded_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Poll until done, failed or timed out; draw progress; say what is missing. The exit code."""
    deadline = clock() + timeout_s
    draw, close = _display(tty)
    was_applied = False
    degraded_since: dict[str, float] = {}
    last: Progress | None = None
    status: dict[str, Any] = {}
    try:
        while True:
            try:
                status = client.status()
            except AdminError as exc:
                draw(None, f"(controller not answering: {exc})")
            else:
                last = progress(status, revision, was_applied=was_applied)
                last = give_up(last, degraded_since, clock(), degraded_s)
                was_applied = was_applied or last.applied == revision
                draw(last, "")
                if last.phase != "waiting":
                    break
            if clock() >= deadline:
                break
            time.sleep(interval_s)
    finally:
        close()
    if last is not None and last.phase == "done":
        typer.echo(f"Revision {short(revision)} is Synced and every model is Healthy.")
        return EXIT_DONE
    timed_out = last is None or last.phase == "waiting"
    head = f"Timed out after {timeout_s:g}s waiting for" if timed_out else "Failed:"
    typer.echo(head, err=True)
    for why in last.why if last else ("the controller to answer",):
        typer.echo(f"  {why}", err=True)
    if status:
        for line in explain_lines(client, status):
            typer.echo(f"  {line}", err=True)
    return EXIT_TIMEOUT if timed_out else EXIT_FAILED


def _display(tty: bool) -> tuple[Callable[[Progress | None, str], None], Callable[[], None]]:
    """A rich Live table on a terminal; otherwise a plain line each time something changes."""
    if not tty:
        printed: list[str] = []

        def plain(p: Progress | None, note: str) -> None:
            text = note or (p.line() if p else "")
            if text and (not printed or printed[-1] != text):
                printed.append(text)
                typer.echo(text)

        return plain, lambda: None

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    live = Live(console=Console(), auto_refresh=False, transient=False)
    live.start()

    kept: list[Progress] = []

    def fancy(p: Progress | None, note: str) -> None:
        if p is not None:
            kept[:] = [p]
        p = kept[0] if kept else None  # a poll that failed keeps the last table, with the note under it
        title = f"{p.sync} · applied {short(p.applied)}" if p else "waiting for the controller"
        table = Table(title=title, caption=note or None, expand=False)
        table.add_column("model")
        table.add_column("health")
        table.add_column("ready", justify="right")
        for m in p.models if p else ():
            colour = HEALTH_STYLE.get(m.health, "white")
            table.add_row(m.name, f"[{colour}]{m.health}[/{colour}]", f"{m.ready}/{m.target}")
        live.update(table, refresh=True)

    return fancy, live.stop
