"""`llmgw mirror import-ollama|unused|remove`: what else fills and keeps the mirror, beside mirror_cmds' `add|list|serve`.

Like those, these work on the mirror host's directory.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from llmgw.adapters.mirror import CheckedFile, MirrorError, MirrorStore
from llmgw.adapters.model_files import InspectError, inspect_source, installed_architectures
from llmgw.adapters.repo_files import load_repo
from llmgw.cli import output
from llmgw.cli.data.mirror_cmds import MirrorDirOpt, mirror_app
from llmgw.core.weights.gguf_arch import architecture_problem
from llmgw.core.weights.mirror_use import Version, parse_version, unused_versions, users_of_versions
from llmgw.core.weights.ollama import MODEL_FILE, OllamaError, blob_path, parse_name, weight_blobs

__all__ = ["register"]


def _ollama_dir() -> Path:
    """Where Ollama keeps models: $OLLAMA_MODELS, else ~/.ollama/models (its own default)."""
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def import_ollama(
    model: Annotated[str, typer.Argument(help="NAME[:TAG] as `ollama pull` takes it, e.g. gemma3:270m")],
    mirror_dir: MirrorDirOpt,
    ollama_dir: Annotated[
        Path | None,
        typer.Option(
            "--ollama-dir", help="Ollama's models directory (default $OLLAMA_MODELS or ~/.ollama/models)"
        ),
    ] = None,
    repo: Annotated[
        str | None, typer.Option("--repo", help="Name in the mirror (default ollama/NAME)")
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option("--revision", help="Revision it is filed under (default TAG-<model digest[:12]>)"),
    ] = None,
    anyway: Annotated[
        bool,
        typer.Option("--anyway", help="Import a GGUF whose architecture the llama.cpp build does not load"),
    ] = False,
) -> None:
    """Copy a pulled model's GGUF (model.gguf) and a vision model's projector (mmproj.gguf) into the mirror, each
    checked against the digest Ollama named its blob by, once the model's GGUF header says llama.cpp loads it."""
    name = parse_name(model)
    root = ollama_dir or _ollama_dir()
    manifest = root / name.manifest
    try:
        body = manifest.read_bytes()
    except OSError as exc:
        raise OllamaError(
            f"{name.words()}: no manifest at {manifest} ({exc.strerror or exc}); pull it with `ollama pull "
            f"{name.words()}` or give --ollama-dir"
        ) from exc
    blobs = weight_blobs(body, str(manifest))
    files = [CheckedFile(b.file_name, root / blob_path(b.sha256), b.sha256, b.size) for b in blobs]
    target_repo = repo or f"ollama/{name.name}"
    model_sha = next(b.sha256 for b in blobs if b.file_name == MODEL_FILE)
    if not anyway:
        _refuse_unloadable(root / blob_path(model_sha), name.words())
    target_revision = revision or f"{name.tag}-{model_sha[:12]}"
    origin = f"ollama {name.words()} ({manifest})"
    added = MirrorStore(mirror_dir).add_checked(files, target_repo, target_revision, origin)
    listed = ", ".join(f"{f.name} ({f.size} bytes)" for f in added)
    typer.echo(f"imported {name.words()} as {target_repo}@{target_revision}: {listed}")


def _refuse_unloadable(model: Path, words: str) -> None:
    """Refuse a model GGUF whose header names an architecture the installed llama.cpp build does not load: it
    would be mirrored, placed, and fail on every node. A header that cannot be read is left to the digest check."""
    try:
        shape = asyncio.run(inspect_source(str(model)))
    except InspectError:
        return
    problem = architecture_problem(shape.architecture, installed_architectures())
    if problem is not None:
        raise OllamaError(f"{words}: {problem}; give --anyway to import it all the same")


_CatalogRepo = Annotated[
    Path,
    typer.Option(
        "--cluster-repo",
        help="The cluster repo whose catalog says what is in use (a checkout of what is applied)",
    ),
]


def _users(repo: Path) -> dict[Version, list[str]]:
    """Who uses which mirror version, from the cluster repo at `repo`; refuses when it cannot read it: an
    unreadable catalog would call everything unused."""
    loaded = load_repo(repo)
    if loaded.repo is None:
        first = loaded.errors[0] if loaded.errors else "no catalog"
        raise MirrorError(
            f"cannot read the catalog at {repo} ({first}; {len(loaded.errors)} error(s), `llmgw validate "
            f"{repo}` lists them): what the mirror holds is not judged unused without it"
        )
    catalog = loaded.repo.catalog
    return users_of_versions(
        {n: m.spec.source for n, m in catalog.models.items()},
        {n: a.source for n, a in catalog.adapters.items()},
    )


def unused(mirror_dir: MirrorDirOpt, repo: _CatalogRepo, as_json: output.JsonOpt = False) -> None:
    """What the mirror holds that no Model or Adapter of the cluster repo's catalog uses."""
    entries = MirrorStore(mirror_dir).entries()
    held = {(e.repo, e.revision): e for e in entries}
    found = [held[v] for v in unused_versions(held, _users(repo))]
    if as_json:
        output.print_json(
            [{"repo": e.repo, "revision": e.revision, "size_bytes": e.size_bytes} for e in found]
        )
        return
    if not found:
        typer.echo(f"every version the mirror holds ({len(entries)}) is used by the catalog at {repo}")
    for e in found:
        typer.echo(f"{e.repo}@{e.revision}  {e.size_bytes} bytes  used by nothing in {repo}")


def remove(
    version: Annotated[str, typer.Argument(help="REPO@REVISION as `llmgw mirror list` prints it")],
    mirror_dir: MirrorDirOpt,
    repo: _CatalogRepo,
) -> None:
    """Delete a version from the mirror, once the catalog no longer uses it."""
    try:
        name, revision = parse_version(version)
    except ValueError as exc:
        raise MirrorError(str(exc)) from exc
    users = _users(repo).get((name, revision))
    if users:
        raise MirrorError(
            f"{version} is still used by {', '.join(users)} in {repo}: retire the entry first (remove it or point "
            "its source elsewhere, and apply), then remove the files; a node that has to fetch them again could not"
        )
    size = MirrorStore(mirror_dir).remove(name, revision)
    typer.echo(f"removed {version} ({size} bytes)")


def register(_app: typer.Typer) -> None:
    mirror_app.command("import-ollama")(import_ollama)
    mirror_app.command("unused")(unused)
    mirror_app.command("remove")(remove)
