"""`llmgw validate [PATH]`: run the validation pipeline on a cluster repo and report every problem."""

from __future__ import annotations

import dataclasses
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from llmgw.adapters.repo_files import load_repo
from llmgw.core.config.secret_bindings import SecretBindingError, SecretBindings
from llmgw.core.config.secretrefs import read_bindings
from llmgw.core.desired.binding_report import binding_report
from llmgw.core.desired.repo import LoadResult

BindingsOpt = Annotated[
    Path | None,
    typer.Option(
        "--bindings",
        help="The operator's secret binding map (bindings.yaml in the controller's secrets directory): "
        "references it does not allow are errors. Without it, each reference sent somewhere is listed with "
        "the line that would bind it",
    ),
]


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
    bindings: BindingsOpt = None,
) -> None:
    """Validate a cluster repo: exit 0 when valid, 1 with every error (file:line:col, path, what, hint)."""
    result = with_bindings(load_repo(path, revision=revision), bindings)
    typer.echo(render(result, output), nl=False)
    raise typer.Exit(0 if result.ok else 1)


def read_bindings_option(path: Path | None) -> SecretBindings | None:
    if path is None:
        return None
    try:
        return read_bindings(path)
    except SecretBindingError as exc:
        typer.echo(f"--bindings: {exc}", err=True)
        raise typer.Exit(1) from None


def with_bindings(result: LoadResult, path: Path | None) -> LoadResult:
    """The result with the binding map's findings added: errors (the map refuses) or warnings (no map)."""
    if result.repo is None:
        return result
    found = binding_report(result.repo, read_bindings_option(path))
    errors = tuple(p for p in found if p.severity == "error")
    warnings = tuple(p for p in found if p.severity == "warning")
    if errors:
        return dataclasses.replace(
            result, repo=None, errors=(*result.errors, *errors), warnings=(*result.warnings, *warnings)
        )
    return dataclasses.replace(result, warnings=(*result.warnings, *warnings))


def capabilities_of(result: LoadResult) -> dict[str, dict[str, Any]]:
    """Per model, what it serves as the router applies it (docs/router.md, Capabilities): the effective set
    (its kind's defaults plus what it declares, less `without`), what it lacks, and whether a request needing
    a checked capability waits for a passed model check (`verified_only`, the model's else the Cluster's)."""
    if result.repo is None:
        return {}
    cat = result.repo.catalog
    out: dict[str, dict[str, Any]] = {}
    for name, entry in sorted(cat.models.items()):
        spec = entry.spec
        out[name] = {
            "capabilities": spec.effective_capabilities,
            "without": list(spec.without),
            "verified_only": cat.cluster.verified_only if spec.verified_only is None else spec.verified_only,
        }
    return out


def capability_lines(capabilities: dict[str, dict[str, Any]]) -> list[str]:
    if not capabilities:
        return []
    lines = ["capabilities (docs/router.md, Capabilities):"]
    for name, found in capabilities.items():
        lacks = f"; without {', '.join(found['without'])}" if found["without"] else ""
        strict = "; verified only" if found["verified_only"] else ""
        lines.append(f"  {name}: {', '.join(found['capabilities'])}{lacks}{strict}")
    return lines


def render(result: LoadResult, output: Format) -> str:
    problems = [*result.errors, *result.warnings]
    if output is Format.json:
        body = {
            "valid": result.ok,
            "errors": [e.to_json() for e in result.errors],
            "warnings": [w.to_json() for w in result.warnings],
            "summary": result.summary(),
            "capabilities": capabilities_of(result),
        }
        return json.dumps(body, indent=2) + "\n"
    if output is Format.github:
        return "".join(p.format_github() + "\n" for p in problems)
    lines = [p.format_text() for p in problems]
    if result.ok and result.repo is not None:
        lines += capability_lines(capabilities_of(result))
        counts = ", ".join(f"{n} {kind}" for kind, n in result.repo.counts().items()) or "no documents"
        lines.append(f"valid: {result.files} files, {counts}; revision {result.repo.revision}")
    else:
        lines.append(f"invalid: {len(result.errors)} error(s) in {result.files} file(s)")
    return "".join(line + "\n" for line in lines)
