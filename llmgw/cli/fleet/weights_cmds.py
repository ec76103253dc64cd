"""`llmgw weights list` and `llmgw weights collect [--dry-run]`: the weights each node holds, and removing
what llmgw fetched that no declared model references (through the controller, then each node's agent, which
checks every path again before it deletes anything)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.console import Console
from rich.table import Table

from llmgw.cli import output
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client

weights_app = typer.Typer(help="Weights on nodes: list them, collect what nothing references.")


def register(app: typer.Typer) -> None:
    app.add_typer(weights_app, name="weights")


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _used_by(f: dict[str, Any]) -> str:
    replicas = ", ".join(f.get("used_by") or [])
    declared = ", ".join(f.get("declared_by") or [])
    words = [w for w in (replicas and f"replicas {replicas}", declared and f"declared by {declared}") if w]
    if words:
        return "; ".join(words)
    return "nothing (collectable)" if f.get("fetched") else "nothing (not fetched by llmgw: kept)"


def _what(f: dict[str, Any]) -> str:
    """A file by its url or path; a published directory by its name and the start of its manifest digest."""
    if f.get("directory"):
        return f"{f['directory']} (directory, manifest {str(f.get('manifest_sha256') or '?')[:12]})"
    return str(f.get("url") or f.get("path") or f["local_path"])


def _origin(f: dict[str, Any]) -> str:
    """A fetched directory's llmgw-origin.json in a line: the version, where its files came from, when."""
    record = f.get("origin")
    if record is None:
        return "(not recorded)" if f.get("directory") else ""
    files = record.get("files") or []
    # Each file's URL less its name: the mirror's or the origin's directory it was fetched from.
    bases = sorted({str(x["from"]).removesuffix(quote(x["name"])) for x in files if x.get("from")})
    times = [x["fetched_at"] for x in files if x.get("fetched_at") is not None]
    version = (
        f"{record['repository']}@{record['revision']}" if record.get("repository") else "a URL directory"
    )
    when = f", last {datetime.fromtimestamp(max(times), UTC):%Y-%m-%d %H:%M UTC}" if times else ""
    return f"{version}: {len(files)} file(s) from {', '.join(bases) or 'not recorded'}{when}"


@weights_app.command("list")
def list_weights(
    controller: ControllerOpt = None, token_file: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Per node: each weights file or directory, its size, what uses it (running replicas, declared models) and,
    for a fetched directory, where its files came from (its llmgw-origin.json; --json: `origin`)."""
    data = controller_client(controller, token_file).get("/api/v1/weights")
    if as_json:
        output.print_json(data)
        return
    table = Table("NODE", "FILE", "SIZE", "FETCHED", "USED BY", "ORIGIN")
    for node in data["nodes"]:
        files = node.get("files")
        if files is None:
            table.add_row(node["node"], "(the agent keeps no weights index)", "", "", "", "")
            continue
        if not files:
            table.add_row(node["node"], "(none)", "", "", "", "")
        for f in files:
            fetched = "yes" if f["fetched"] else "no"
            size = _size(f.get("size_bytes"))
            table.add_row(node["node"], _what(f), size, fetched, _used_by(f), _origin(f))
    Console().print(table)


@weights_app.command("collect")
def collect(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")
    ] = False,
    node: Annotated[str | None, typer.Option("--node", help="Only this node.")] = None,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove weights llmgw fetched that no running replica uses and no declared model references."""
    client = controller_client(controller, token_file)
    body: dict[str, Any] = {"dry_run": dry_run} | ({"node": node} if node else {})
    _, data = client.post("/api/v1/weights/collect", body)
    if as_json:
        output.print_json(data)
        return
    console = Console()
    verb = "would remove" if dry_run else "removed"
    total, failed = 0, False
    for result in data["nodes"]:
        if result.get("error"):
            failed = True
            console.print(f"[red]{result['node']}[/red]: {result['error']}", highlight=False)
            continue
        for r in result.get("removed", []):
            total += r.get("size_bytes") or 0
            what = f"directory {r['directory']}" if r.get("directory") else r["url"]
            console.print(f"{result['node']}: {verb} {what} ({_size(r.get('size_bytes'))})", highlight=False)
        for r in result.get("refused", []):
            console.print(f"{result['node']}: kept {r['local_path']}: {r['reason']}", highlight=False)
    # "asked to": each node decides, and one that refuses a path it cannot prove it fetched is working.
    console.print(
        f"{verb} {_size(total)} in all" + (" (nodes were asked; see errors above)" if failed else "")
    )
    if failed:
        raise typer.Exit(1)
