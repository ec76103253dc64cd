"""`llmgw traffic export` and `llmgw traffic import`: recorded request shapes as a trace, and back.

The trace format is llmgw.core.traffic.trace's (docs/traffic.md). The store is the deployment's, found as for `llmgw
usage` (llmgw.cli.data.store_find: `--store`, LLMGW_STORE, the controller's configuration or admin API, the local
store `llmgw up` made), named on standard error; a missing one is an error, not an empty trace.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from llmgw.adapters.traffic import ImportResult, export_lines, import_trace
from llmgw.cli import output
from llmgw.cli.data.store_cmds import ControllerConfigOpt, StoreOpt, run_on_store
from llmgw.cli.data.store_find import StoreWhere
from llmgw.cli.output import fail
from llmgw.core.traffic.trace import TraceError, parse_trace
from llmgw.core.words import parse_duration
from llmgw.store import Store

traffic_app = typer.Typer(
    help="Recorded traffic: export a trace of request shapes, or import one.", no_args_is_help=True
)


@traffic_app.command("export")
def traffic_export(
    since: Annotated[str, typer.Option("--since", help="Requests completed in the last 7d, 24h, ...")] = "7d",
    model: Annotated[str | None, typer.Option("--model", help="Only this model's requests")] = None,
    project: Annotated[str | None, typer.Option("--project", help="Only this project's requests")] = None,
    out: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write here (default: standard output)")
    ] = None,
    store: StoreOpt = None,
    controller_config: ControllerConfigOpt = None,
) -> None:
    """Write a trace (JSON lines: a header, then one request per line in arrival order) from the store."""
    try:
        window = parse_duration(since, bare_seconds=False, positive=True)
    except ValueError as exc:
        fail(f"--since: {exc}")
    until = time.time()
    target = out.open("w", encoding="utf-8") if out is not None else sys.stdout

    async def go(s: Store) -> int:
        written = -1  # the header is not a request
        async for line in export_lines(s, until - window, until, model=model, project=project):
            target.write(line + "\n")
            written += 1
        return written

    try:
        count = run_on_store(StoreWhere(store, controller_config), go)
    finally:
        if out is not None:
            target.close()
    if out is not None:
        output.console(stderr=True).print(f"wrote {count} requests to {out}", highlight=False)


@traffic_app.command("import")
def traffic_import(
    file: Annotated[Path, typer.Argument(help="A trace (llmgw traffic export, or written by hand)")],
    source: Annotated[
        str | None,
        typer.Option(
            "--source", help="Name the rows are marked with, router_id import:NAME (default: the file's name)"
        ),
    ] = None,
    ends_now: Annotated[
        bool,
        typer.Option(
            "--ends-now",
            help="Shift the trace so its window ends now (a synthetic trace starting at 0, or one older than the "
            "controller's usage_retention, which would be pruned at its next pass)",
        ),
    ] = False,
    store: StoreOpt = None,
    controller_config: ControllerConfigOpt = None,
) -> None:
    """Load a trace into the store as usage rows marked `import:<source>`; bad lines are skipped and named."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}")
    try:
        trace = parse_trace(text.splitlines())
    except TraceError as exc:
        fail(f"{file}: {exc}")
    name = source or file.name
    if not name.strip():
        fail("--source: the rows need a non-empty name")
    digest = hashlib.sha256(text.encode()).hexdigest()
    if ends_now:
        trace = replace(trace, header=replace(trace.header, start=time.time() - trace.header.duration_s))
    # Rows written where --store (or LLMGW_STORE) names: a new store there is what was asked for.
    where = StoreWhere(store, controller_config, may_create=True)
    result: ImportResult = run_on_store(where, lambda s: import_trace(s, trace, name, digest))
    console = output.console(stderr=True)
    for problem in result.skipped:
        console.print(f"{file}: {problem} (skipped)", highlight=False, markup=False)
    again = result.read - result.imported
    console.print(
        f"imported {result.imported} requests from {file} as import:{name}"
        + (f"; {again} were already imported" if again else "")
        + (f"; {len(result.skipped)} lines skipped" if result.skipped else ""),
        highlight=False,
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(traffic_app, name="traffic")
