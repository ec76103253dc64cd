"""`llmgw validate [PATH]`: run the validation pipeline on a cluster repo and report every problem."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from llmgw.adapters.repo_files import load_repo
from llmgw.core.repo import LoadResult


class Format(StrEnum):
    text = "text"
    json = "json"
    github = "github"


def validate(
    path: Annotated[Path, typer.Argument(help="Cluster repo directory (or one YAML file)")] = Path("."),
    output: Annotated[
        Format,
        typer.Option("--format", "-f", help="text for people, json for programs, github for CI annotations"),
    ] = Format.text,
    revision: Annotated[
        str | None, typer.Option(help="Revision to report (e.g. a commit SHA); default: a content hash")
    ] = None,
) -> None:
    """Validate a cluster repo: exit 0 when valid, 1 with every error (file:line:col, path, what, hint)."""
    result = load_repo(path, revision=revision)
    typer.echo(render(result, output), nl=False)
    raise typer.Exit(0 if result.ok else 1)


def render(result: LoadResult, output: Format) -> str:
    problems = [*result.errors, *result.warnings]
    if output is Format.json:
        body = {
            "valid": result.ok,
            "errors": [e.to_json() for e in result.errors],
            "warnings": [w.to_json() for w in result.warnings],
            "summary": result.summary(),
        }
        return json.dumps(body, indent=2) + "\n"
    if output is Format.github:
        return "".join(p.format_github() + "\n" for p in problems)
    lines = [p.format_text() for p in problems]
    if result.ok and result.repo is not None:
        counts = ", ".join(f"{n} {kind}" for kind, n in result.repo.counts().items()) or "no documents"
        lines.append(f"valid: {result.files} files, {counts}; revision {result.repo.revision}")
    else:
        lines.append(f"invalid: {len(result.errors)} error(s) in {result.files} file(s)")
    return "".join(line + "\n" for line in lines)
