"""`llmgw schemas write [DIR]`, `llmgw schemas docs [FILE]` and `llmgw schemas openapi [FILE]`: regenerate the
committed schemas, the cluster repo reference and the admin API's OpenAPI document."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmgw.core.config.docs import render_reference
from llmgw.core.config.schemas import all_schemas, render

app = typer.Typer(
    help="JSON Schemas of the cluster repo, generated from the config models.", no_args_is_help=True
)


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in all_schemas().items():
        target = directory / name
        target.write_text(render(schema), encoding="utf-8")
        written.append(target)
    return written


@app.command("write")
def write(
    directory: Annotated[Path, typer.Argument(help="Where to write the *.schema.json files")] = Path(
        "schemas"
    ),
) -> None:
    """Write one JSON Schema per kind, plus cluster-repo.schema.json for files mixing kinds."""
    for target in write_schemas(directory):
        typer.echo(f"wrote {target}")


@app.command("docs")
def docs(
    target: Annotated[Path, typer.Argument(help="Markdown file to write")] = Path("docs/cluster-repo.md"),
) -> None:
    """Write the cluster repo reference (every kind and field) generated from the schemas."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_reference(), encoding="utf-8")
    typer.echo(f"wrote {target}")


OPENAPI_FILE = Path("docs/admin-openapi.json")


@app.command("openapi")
def openapi(
    target: Annotated[Path, typer.Argument(help="JSON file to write")] = OPENAPI_FILE,
) -> None:
    """Write the controller's admin API as OpenAPI 3.1, generated from its route table."""
    # Here, not at the top: the other commands need none of the controller.
    from llmgw.controller.api.routes import openapi_document
    from llmgw.core.api.openapi import render

    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(openapi_document()), encoding="utf-8")
    typer.echo(f"wrote {target}")
