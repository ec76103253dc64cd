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
    MirrorStore,
    hash_directory,
    manifest_text,
    published_manifest,
    run_forever,
)
from llmgw.adapters.model_files import InspectError, inspect_source, installed_architectures
from llmgw.cli import output
from llmgw.cli.reach import controller_client
from llmgw.controller.parts.settings import parse_hostport
from llmgw.core.fleet.views import LiveState
from llmgw.core.weights.fetch_plan import DEFAULT_REVISION
from llmgw.core.weights.fit_table import GPU_COUNTS, FitRow, fit_table
from llmgw.core.weights.gguf_arch import architecture_problem
from llmgw.core.weights.manifest import ManifestFile, total_bytes
from llmgw.core.weights.memory_fit import GIB, class_memory

model_app = typer.Typer(help="Model sources.", no_args_is_help=True)
mirror_app = typer.Typer(help="The weights mirror (HF layout) on this machine.", no_args_is_help=True)

MirrorDirOpt = Annotated[
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
    if _is_url(source):
        files = asyncio.run(published_manifest(source, token))
    else:
        files = hash_directory(Path(source))
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
    shape = asyncio.run(inspect_source(source, _token(token_file)))
    shown_json = shape.to_json()
    if shape.format == "gguf":  # whether llama.cpp loads it: the answer is in the header
        build = installed_architectures()
        problem = architecture_problem(shape.architecture, build)
        shown_json["llamacpp"] = {"build": build.build, "from": build.source, "loads": problem is None}
        shown_json["llamacpp"] |= {"problem": problem} if problem else {}
    if as_json:
        output.print_json(shown_json)
        return
    for key, value in shape.to_json().items():
        shown = "(not in the headers)" if value is None else f"{value:,}" if isinstance(value, int) else value
        typer.echo(f"{key.replace('_', ' ') + ':':18} {shown}")
    if shape.format == "gguf":
        words = "loads it" if problem is None else f"does not load it: {problem}"
        typer.echo(f"{'llama.cpp:':18} {build.words()} {words}")


COMMON_CLASSES = {"l4-24g": 24, "a100-40g": 40, "l40s-48g": 48, "h100-80g": 80}  # GiB per card


def _classes(
    given: list[str], state: Path | None, controller: str | None, token_file: Path | None
) -> tuple[dict[str, int], str]:
    """GPU class -> bytes per card, and where the classes came from."""
    if given:
        out: dict[str, int] = {}
        for item in given:
            name, _, size = item.partition("=")
            try:
                gib = float(size)
            except ValueError:
                gib = 0.0
            if not name or gib <= 0:
                raise _fail(f"--gpu-class {item!r}: give NAME=GiB per card, e.g. h100-80g=80")
            out[name] = int(gib * GIB)
        return out, "--gpu-class"
    if state is not None or controller is not None:
        if state is not None:
            try:
                live = LiveState.model_validate_json(state.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise _fail(f"--state {state}: not a saved live state ({str(exc).splitlines()[0]})") from exc
            where = f"saved state {state}"
        else:
            client = controller_client(controller, token_file)
            live = client.state()
            where = client.url
        found = class_memory((g.gpu_class, g.memory_bytes) for n in live.node_views() for g in n.gpus or ())
        if not found:
            raise _fail(
                f"no node in {where} reports a GPU with its class and memory: give --gpu-class NAME=GiB"
            )
        return found, f"the fleet ({where}; the smallest card of each class)"
    return {
        k: v * GIB for k, v in COMMON_CLASSES.items()
    }, "common classes (give --state, --controller or --gpu-class for your fleet)"


@model_app.command("plan")
def plan(
    source: Annotated[
        str, typer.Argument(help="A .gguf or .safetensors file, a model directory, or a URL of one")
    ],
    context_length: Annotated[
        int | None, typer.Option("--context", help="Tokens per sequence (default: the trained context)")
    ] = None,
    slots: Annotated[int | None, typer.Option("--slots", help="Sequences held at once (default 1)")] = None,
    gpu_class: Annotated[
        list[str] | None, typer.Option("--gpu-class", help="NAME=GiB per card; repeat for several")
    ] = None,
    state: Annotated[
        Path | None, typer.Option("--state", help="The fleet's classes from a saved live state")
    ] = None,
    controller: Annotated[
        str | None, typer.Option("--controller", help="The fleet's classes from a controller")
    ] = None,
    admin_token_file: Annotated[
        Path | None, typer.Option("--admin-token-file", help="Admin token for --controller")
    ] = None,
    as_json: output.JsonOpt = False,
    token_file: _TokenFile = None,
) -> None:
    """Every way the model could run on every GPU class: precision (and the engine that serves it), cards per
    replica, and per card the weights, KV cache and overhead against what is usable."""
    shape = asyncio.run(inspect_source(source, _token(token_file)))
    context = context_length or shape.trained_context
    if context is None:
        raise _fail("the headers give no trained context: give --context TOKENS")
    classes, where = _classes(gpu_class or [], state, controller, admin_token_file)
    rows = fit_table(shape, classes, context_length=context, slots=slots)
    if as_json:
        output.print_json(_plan_json(source, context, where, rows))
        return
    seqs = slots or 1
    typer.echo(
        f"{source}: {shape.architecture or 'unknown architecture'}, {context:,} tokens x {seqs} sequence(s)"
    )
    typer.echo(f"GPU classes: {where}")
    _print_plan(rows, sorted(classes))


def _plan_json(source: str, context: int, where: str, rows: tuple[FitRow, ...]) -> dict[str, object]:
    return {
        "source": source,
        "context_length": context,
        "classes_from": where,
        "rows": [
            {
                "precision": r.precision.name,
                "engine": r.precision.engine,
                "how": r.precision.how,
                "gpus": r.gpus,
                "gpu_class": r.gpu_class,
                "fits": r.fit.fits,
                "needed_bytes": r.fit.needed,
                "usable_bytes": r.fit.usable,
                "headroom_bytes": r.fit.headroom,
                "words": r.fit.words(),
            }
            for r in rows
        ],
    }


def _print_plan(rows: tuple[FitRow, ...], names: list[str]) -> None:
    """One row per precision and card count, a column per GPU class; then the fewest cards per class."""
    table = Table(
        "PRECISION", "ENGINE", "GPUS", *(n.upper() for n in names), title="per card: needed / usable"
    )
    cells: dict[tuple[str, int], dict[str, str]] = {}
    for r in rows:
        f = r.fit
        if f.needed is None:
            cell = "unknown"
        else:
            cell = f"{'yes' if f.fits else 'no'} {f.needed / GIB:.1f} / {f.usable / GIB:.1f} GiB"
        cells.setdefault((r.precision.name, r.gpus), {})[r.gpu_class] = cell
    engines = {r.precision.name: r.precision.engine for r in rows}
    for (name, gpus), by_class in cells.items():
        table.add_row(name, engines[name], str(gpus), *(by_class.get(n, "") for n in names))
    Console(width=max(100, 30 + 22 * len(names))).print(table)
    typer.echo(
        "per card = weights / cards + KV cache (context x sequences, its layers' and heads' share) + 1 GiB runtime"
    )
    smallest: dict[str, FitRow] = {}
    for r in rows:
        if r.fit.fits and r.gpu_class not in smallest:
            smallest[r.gpu_class] = r
    for cls in names:
        best = smallest.get(cls)
        if best is None:
            typer.echo(f"{cls}: does not fit on up to {GPU_COUNTS[-1]} cards at any precision listed")
        else:
            p = best.precision
            typer.echo(f"{cls}: fewest cards: {best.gpus} at {p.name} ({p.engine}, {p.how})")


@mirror_app.command("add")
def add(
    source: Annotated[
        str, typer.Argument(help="A local model directory, or a URL whose server publishes one")
    ],
    repo: Annotated[str, typer.Option("--repo", help="The name nodes ask for, e.g. Qwen/Qwen2.5-0.5B")],
    mirror_dir: MirrorDirOpt,
    revision: Annotated[
        str, typer.Option("--revision", help="Revision it is filed under")
    ] = DEFAULT_REVISION,
    token_file: _TokenFile = None,
) -> None:
    """Put a model directory into the mirror as {repo}/{revision}, with its manifest; never replaces one."""
    store = MirrorStore(mirror_dir)
    if _is_url(source):
        files: list[ManifestFile] = asyncio.run(store.add_url(source, repo, revision, _token(token_file)))
    else:
        files = store.add_directory(Path(source), repo, revision)
    typer.echo(f"added {repo}@{revision}: {len(files)} files, {_size(total_bytes(files))}")


@mirror_app.command("list")
def list_(
    mirror_dir: MirrorDirOpt,
    as_json: output.JsonOpt = False,
) -> None:
    """What the mirror holds: each repo@revision with its file count, size, origin, and what is wrong with it."""
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
    table = Table("REPO", "REVISION", "FILES", "SIZE", "ORIGIN", "PROBLEM")
    for e in entries:
        origin = e.origin or "(not recorded)"
        table.add_row(e.repo, e.revision, str(e.files), _size(e.size_bytes), origin, e.problem or "")
    Console().print(table)


@mirror_app.command("serve")
def serve(
    mirror_dir: MirrorDirOpt,
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
