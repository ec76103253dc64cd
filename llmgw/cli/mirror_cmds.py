"""`llmgw model manifest`, `llmgw mirror add|list|serve`: directory sources and the weights mirror, on files.

These work on the mirror host's directory (as `llmgw keys` works on the store): the controller and the servers
never write to the mirror, so a node cannot be served a model nobody added.
"""

from __future__ import annotations

import asyncio
import hmac
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from llmgw.adapters.mirror import (
    MirrorError,
    MirrorStore,
    hash_directory,
    manifest_text,
    published_manifest,
    run_forever,
)
from llmgw.adapters.model_files import InspectError, inspect_source
from llmgw.cli import output
from llmgw.controller.settings import parse_hostport
from llmgw.core.fetch_plan import DEFAULT_REVISION
from llmgw.core.manifest import ManifestFile, total_bytes

model_app = typer.Typer(help="Model sources.", no_args_is_help=True)
mirror_app = typer.Typer(help="The weights mirror (HF layout) on this machine.", no_args_is_help=True)

_MirrorDir = Annotated[
    Path, typer.Option("--mirror-dir", envvar="LLMGW_MIRROR_DIR", help="The mirror's directory")
]
_TokenFile = Annotated[
    Path | None,
    typer.Option("--token-file", help="File holding a bearer token for the source (e.g. HF token)"),
]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text().strip() or None
    except OSError as exc:
        raise _fail(f"--token-file {path}: {exc.strerror or exc}") from exc


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _size(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@model_app.command("manifest")
def manifest(
    source: Annotated[
        str, typer.Argument(help="A local model directory, or a URL whose server publishes one")
    ],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write here (default: stdout)")
    ] = None,
    token_file: _TokenFile = None,
) -> None:
    """Write a directory source's manifest (names, sizes, sha256, and the model's shape from its headers) for
    spec.source.manifest."""
    token = _token(token_file)
    try:
        if _is_url(source):
            files = asyncio.run(published_manifest(source, token))
        else:
            files = hash_directory(Path(source))
    except MirrorError as exc:
        raise _fail(str(exc)) from exc
    try:
        where = source if not _is_url(source) or source.endswith("/") else source + "/"
        shape = asyncio.run(inspect_source(where, token))
    except InspectError as exc:  # the files are still described; offline validate just knows less
        typer.echo(f"warning: the model's headers were not recorded: {exc}", err=True)
        shape = None
    text = manifest_text(files, shape)
    if output is None:
        typer.echo(text, nl=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    typer.echo(f"wrote {output}: {len(files)} files, {_size(total_bytes(files))}", err=True)


@model_app.command("inspect")
def inspect(
    source: Annotated[
        str,
        typer.Argument(
            help="A .gguf or .safetensors file, a model directory, or an http(s) URL of one (a directory URL "
            "ends in `/` and its server publishes a manifest); over HTTP only the headers are read"
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
    token_file: _TokenFile = None,
) -> None:
    """Print a model's shape from its own headers: architecture, layers, trained context, quantization or
    dtype, parameters, tensor bytes, attention and KV heads."""
    try:
        shape = asyncio.run(inspect_source(source, _token(token_file)))
    except InspectError as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        output.print_json(shape.to_json())
        return
    for key, value in shape.to_json().items():
        shown = "(not in the headers)" if value is None else f"{value:,}" if isinstance(value, int) else value
        typer.echo(f"{key.replace('_', ' ') + ':':18} {shown}")


@mirror_app.command("add")
def add(
    source: Annotated[
        str, typer.Argument(help="A local model directory, or a URL whose server publishes one")
    ],
    repo: Annotated[str, typer.Option("--repo", help="The name nodes ask for, e.g. Qwen/Qwen2.5-0.5B")],
    mirror_dir: _MirrorDir,
    revision: Annotated[
        str, typer.Option("--revision", help="Revision it is filed under")
    ] = DEFAULT_REVISION,
    token_file: _TokenFile = None,
) -> None:
    """Put a model directory into the mirror as {repo}/{revision}, with its manifest; never replaces one."""
    store = MirrorStore(mirror_dir)
    try:
        if _is_url(source):
            files: list[ManifestFile] = asyncio.run(store.add_url(source, repo, revision, _token(token_file)))
        else:
            files = store.add_directory(Path(source), repo, revision)
    except MirrorError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"added {repo}@{revision}: {len(files)} files, {_size(total_bytes(files))}")


@mirror_app.command("list")
def list_(
    mirror_dir: _MirrorDir,
    as_json: output.JsonOpt = False,
) -> None:
    """What the mirror holds: each repo@revision with its file count and size, and what is wrong with it."""
    entries = MirrorStore(mirror_dir).entries()
    if as_json:
        output.print_json([e.__dict__ for e in entries])
        return
    if not entries:
        typer.echo(
            f"the mirror at {mirror_dir} holds nothing"
            + ("" if mirror_dir.is_dir() else " (no such directory)")
        )
        return
    table = Table("REPO", "REVISION", "FILES", "SIZE", "PROBLEM")
    for e in entries:
        table.add_row(e.repo, e.revision, str(e.files), _size(e.size_bytes), e.problem or "")
    Console().print(table)


@mirror_app.command("serve")
def serve(
    mirror_dir: _MirrorDir,
    listen: Annotated[str, typer.Option("--listen", help="host:port")] = "127.0.0.1:7073",
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="Only this bearer token may read (default: anyone)")
    ] = None,
) -> None:
    """Serve the mirror read-only (GET/HEAD /{repo}/resolve/{revision}/{file}, with Range)."""
    host, port = parse_hostport(listen, "--listen")
    token = _token(token_file)

    def allowed(presented: str | None) -> bool:
        return token is None or (presented is not None and hmac.compare_digest(presented, token))

    typer.echo(
        f"serving {mirror_dir} on http://{host}:{port}/ read-only; "
        + ("readers need the token in --token-file" if token else "anyone who reaches it may read")
    )
    run_forever(mirror_dir, host, port, allowed)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
    app.add_typer(mirror_app, name="mirror")
