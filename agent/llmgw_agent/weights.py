"""Model weights: a local path used in place, or an http(s) URL fetched into a cache named by its hash.

Downloads go to `NAME.part` and are renamed only once size and sha256 (when declared) check out; an interrupted
download resumes with a Range request. Only files this module wrote are ever deleted: a local source is never
touched. Link-local and cloud metadata addresses are refused as sources (a profile must not be a way to read a
node's cloud credentials), including after redirects and DNS resolution: `following` checks every hop's URL,
the connector's resolver checks every address it returns, so the address checked is the address connected to
(no second lookup a TTL-0 record could flip), and its socket factory checks the address connected to once more
(aiohttp asks no resolver for a literal address). The file name comes from the decoded URL path and must be one plain name (llmgw_agent.repo_rules), and the
resolved path must stay under the cache. A download with no declared size stops at `max_bytes`.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult

from llmgw_agent import repo_rules
from llmgw_agent.gguf_parts import gguf_entry
from llmgw_agent.protocol import WeightSource

Progress = Callable[[int, int | None], None]
CHUNK = 1 << 20
MAX_REDIRECTS = 5
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
# A download with no declared size_bytes stops here (the agent's `max_download_bytes` setting overrides it).
DEFAULT_MAX_DOWNLOAD_BYTES = 200 * 1024**3
_REFUSED_HOSTS = {"metadata.google.internal", "metadata", "metadata.azure.internal"}
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
# Metadata services outside link-local: AWS's IPv6 endpoint and Alibaba Cloud's (as llmgw.core.security lists them).
_METADATA_ADDRESSES = (ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200"))


class WeightsError(Exception):
    """A source that cannot be used; the message says which and why."""


class NotAtSource(WeightsError):
    """The server answered 404: the file is not there (a mirror that lacks it sends the agent to the origin)."""


def refused_address(host: str) -> str | None:
    """Why `host` (a name or literal address) is refused as a weights source, or None when it is allowed."""
    name = host.strip("[]").rstrip(".").lower()
    if name in _REFUSED_HOSTS:
        return f"{host} is a cloud metadata service"
    try:
        addr = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr in _METADATA_ADDRESSES:
        return f"{host} is a cloud metadata service address"
    if any(addr in net for net in _LINK_LOCAL if net.version == addr.version):
        return f"{host} is link-local (cloud metadata services live there)"
    return None


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WeightsError(f"weights source {url!r}: only http(s) URLs or local paths are allowed")
    reason = refused_address(parts.hostname)
    if reason:
        raise WeightsError(f"weights source {url!r} refused: {reason}")


class CheckedResolver(AbstractResolver):
    """Resolves once and refuses the whole answer when any address is refused: what aiohttp connects to is
    exactly what was checked. `inner` is the resolver asked (aiohttp's threaded getaddrinfo by default)."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self.inner = inner or aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            answers = await self.inner.resolve(host, port, family)
        except OSError as exc:
            raise WeightsError(f"weights source host {host}: cannot resolve it: {exc}") from exc
        for answer in answers:
            reason = refused_address(str(answer["host"]))
            if reason:
                raise WeightsError(f"weights source host {host} refused: it resolves to {reason}")
        return answers

    async def close(self) -> None:
        await self.inner.close()


class RefusedAddress(WeightsError, OSError):
    """A connection about to open to a refused address (an OSError, so aiohttp reports it as a connect error)."""


def _checked_socket(addr_info: AddrInfoType) -> socket.socket:
    """aiohttp's socket factory: the address about to be connected to, checked. aiohttp skips the resolver for
    a literal address (in a URL or in a redirect's Location), so this is the check no URL form can pass by."""
    family, type_, proto, _, sockaddr = addr_info
    reason = refused_address(str(sockaddr[0]))
    if reason:
        raise RefusedAddress(f"connection to {sockaddr[0]} refused: {reason}")
    return socket.socket(family=family, type=type_, proto=proto)


def checked_session(resolver: AbstractResolver | None = None) -> aiohttp.ClientSession:
    """A session whose every connection goes through CheckedResolver and, for the address actually connected
    to, `_checked_socket` (the only way weights, manifests, archives and model headers are fetched). Follow
    redirects with `following`, never with aiohttp's own."""
    connector = aiohttp.TCPConnector(resolver=CheckedResolver(resolver), socket_factory=_checked_socket)
    timeout = aiohttp.ClientTimeout(sock_read=60, sock_connect=30)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


@asynccontextmanager
async def following(
    session: aiohttp.ClientSession,
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    auth: Mapping[str, str] | None = None,
    client_timeout: aiohttp.ClientTimeout | None = None,
    each_answer: Callable[[aiohttp.ClientResponse], None] | None = None,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """The answer at `url` after at most MAX_REDIRECTS redirects, followed by hand: every hop passes `check_url`
    before it is asked (a literal address in a Location header, which no resolver sees, included), and `auth`
    (an Authorization header) goes to `url`'s own origin only: a redirect elsewhere (HF sends files to a CDN)
    is followed without it. `each_answer` sees every answer, redirects included (the Hub's first hop carries
    the file's size and hash). The one redirect-follower of the agent and of the controller's fetches."""
    target = url
    for _ in range(MAX_REDIRECTS + 1):
        check_url(target)
        hop = {**(headers or {}), **(auth if auth and _same_origin(target, url) else {})}
        async with session.request(
            method, target, headers=hop, allow_redirects=False, timeout=client_timeout or session.timeout
        ) as resp:
            if each_answer is not None:
                each_answer(resp)
            if resp.status not in REDIRECT_STATUSES:
                yield resp
                return
            target = urljoin(target, resp.headers.get("Location", ""))
    raise WeightsError(f"fetching {url}: more than {MAX_REDIRECTS} redirects")


def cache_path(cache_dir: Path, url: str) -> Path:
    """Where `url` lands: a directory named by the hash of the source, keeping the file's own (decoded) name.
    Raises WeightsError when that name is not one plain file name or the path would leave `cache_dir`."""
    problem = repo_rules.weights_name_problem(url)
    if problem:
        raise WeightsError(
            f"weights source {url!r} refused: {problem} (the file name must be one plain name)"
        )
    digest = hashlib.sha256(url.encode()).hexdigest()[:24]
    path = cache_dir / digest / repo_rules.weights_file_name(url)
    if not path.resolve().is_relative_to(cache_dir.resolve()):
        raise WeightsError(f"weights source {url!r} refused: its file would land outside the weights cache")
    return path


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _verify_sync(path: Path, source: WeightSource, what: str, reveal: bool) -> None:
    # `reveal` is False for a node path the repo named: saying its real size and hash would let a document
    # author probe any file on the node; the agent's own downloads are the author's bytes anyway.
    if source.size is not None:
        size = path.stat().st_size
        if size != source.size:
            actual = f"size {size} bytes" if reveal else "its size differs from"
            raise WeightsError(f"{what}: {actual}, declared {source.size}")
    if source.sha256:
        actual_hash = _sha256_of(path)
        if actual_hash.lower() != source.sha256.lower():
            actual = f"sha256 {actual_hash}" if reveal else "its sha256 differs from"
            raise WeightsError(f"{what}: {actual}, declared {source.sha256}")


async def _verify(path: Path, source: WeightSource, what: str, *, reveal: bool = True) -> None:
    # Hashing gigabytes must not stall the agent's heartbeats.
    await asyncio.to_thread(_verify_sync, path, source, what, reveal)


def _local_kind(path: Path) -> str:
    return "file" if path.is_file() else "dir" if path.exists() else "missing"


def _node_path(text: str) -> Path:
    """`~` is this node's home: the example repo's model path starts with it."""
    return Path(text).expanduser()


async def resolve(
    source: WeightSource,
    cache_dir: Path,
    progress: Progress,
    *,
    max_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES,
    resolver: AbstractResolver | None = None,
) -> str:
    """The local path the engine should load, fetching first when the source is a URL. A download stops at
    the declared size, or at `max_bytes` when none is declared. `resolver` is asked for addresses (through
    CheckedResolver); tests give one, the agent uses getaddrinfo."""
    if source.path:
        path = _node_path(source.path)
        kind = _local_kind(path)
        if kind == "missing":
            raise WeightsError(f"weights path {source.path} does not exist on this node")
        if kind == "file":
            await _verify(path, source, f"weights path {source.path}", reveal=False)
        return str(path)
    if not source.url:
        raise WeightsError("weights source names neither a path nor a url")
    check_url(source.url)
    final = cache_path(cache_dir, source.url)
    if final.exists():
        await _verify(final, source, f"cached {final}")
        progress(final.stat().st_size, final.stat().st_size)
        return str(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    limit = source.size if source.size is not None else max_bytes
    async with checked_session(resolver) as session:
        await _download(session, source.url, final, source, progress, limit)
    return str(final)


async def _download(
    session: aiohttp.ClientSession,
    url: str,
    final: Path,
    source: WeightSource,
    progress: Progress,
    limit: int,
    auth: dict[str, str] | None = None,
) -> None:
    """`auth` (an Authorization header) goes to `url`'s own host only: a redirect elsewhere (HF sends files to
    a CDN) is followed without it, so a token never reaches a host it was not given for."""
    part = final.with_name(final.name + ".part")
    done = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={done}-"} if done else {}
    async with following(session, url, headers=headers, auth=auth or {}) as resp:
        if not (resp.status == 416 and done):  # 416: the .part already holds everything; verified below
            await _receive(resp, part, done, url, source, progress, limit)
    try:
        await _verify(part, source, f"download of {url}")
    except WeightsError:
        part.unlink(missing_ok=True)  # ours, and wrong: do not resume from it
        raise
    os.replace(part, final)


async def _receive(
    resp: aiohttp.ClientResponse,
    part: Path,
    done: int,
    url: str,
    source: WeightSource,
    progress: Progress,
    limit: int,
) -> None:
    """Append the answer to `part` (which holds `done` bytes), or start it over when the server ignored Range."""
    if resp.status == 404:
        raise NotAtSource(f"fetching {url}: HTTP 404")
    if resp.status not in (200, 206):
        raise WeightsError(f"fetching {url}: HTTP {resp.status}")
    if resp.status == 200:
        done = 0
    total = (done + resp.content_length) if resp.content_length is not None else source.size
    progress(done, total)
    with part.open("ab" if done else "wb") as f:
        async for chunk in resp.content.iter_chunked(CHUNK):
            if done + len(chunk) > limit:
                await asyncio.to_thread(part.unlink, missing_ok=True)
                raise WeightsError(_too_large(url, limit, source))
            f.write(chunk)
            done += len(chunk)
            progress(done, total)


def _same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def _too_large(url: str, limit: int, source: WeightSource) -> str:
    if source.size is not None:
        return f"fetching {url}: more than the declared size_bytes {limit}"
    return (
        f"fetching {url}: more than {limit} bytes with no size_bytes declared "
        "(declare spec.source.size_bytes, or raise the agent's max_download_bytes)"
    )


def engine_model_path(engine: str, path: str | None) -> str | None:
    """What the engine is given for the weights at `path`: the path itself, except a directory for llama.cpp,
    which loads one GGUF file: its single GGUF, or the first part of its split set (llama-server finds the
    other parts beside it). Raises WeightsError naming the directory when it holds no usable GGUF."""
    if engine != "llamacpp" or path is None or not os.path.isdir(path):
        return path
    root = Path(path)
    names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    entry = gguf_entry(names)
    if entry.path is None:
        raise WeightsError(f"llamacpp: {path}: {entry.problem}")
    return str(root / entry.path)
