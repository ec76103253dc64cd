"""`llmgw mirror import-ollama`: what else fills and keeps the mirror, beside mirror_cmds' `add|list|serve`.

Like those, these work on the mirror host's directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from llmgw.adapters.mirror import CheckedFile, MirrorStore
from llmgw.cli.data.mirror_cmds import MirrorDirOpt, mirror_app
from llmgw.core.weights.ollama import OllamaError, blob_path, parse_name, weight_blobs

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
) -> None:
    """Copy a pulled model's GGUF (model.gguf) and a vision model's projector (mmproj.gguf) into the mirror, each
    checked against the digest Ollama named its blob by."""
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
    target_revision = revision or f"{name.tag}-{blobs[0].sha256[:12]}"
    added = MirrorStore(mirror_dir).add_checked(files, target_repo, target_revision)
    listed = ", ".join(f"{f.name} ({f.size} bytes)" for f in added)
    typer.echo(f"imported {name.words()} as {target_repo}@{target_revision}: {listed}")


def register(_app: typer.Typer) -> None:
    mirror_app.command("import-ollama")(import_ollama)
