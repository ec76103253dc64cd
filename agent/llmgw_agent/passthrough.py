"""The key-checking pass-through in front of each engine: the only socket routers reach.

Engines listen on 127.0.0.1; the agent listens on the node's serving address and forwards every request whose
`Authorization: Bearer KEY` matches the replica's engine key. The check covers every path, because engines'
own keys do not: vLLM guards only its API prefixes (`/invocations`, `/pooling`, `/score`, `/metrics` are open),
SGLang leaves `/metrics` open, TRT-LLM has no key at all. Bodies stream both ways chunk by chunk, never buffered,
so a token the engine writes reaches the router as soon as it is read.

Only a digest of the key is held (and persisted for re-adoption after an agent restart), so the key itself never
reaches the state directory.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

log = logging.getLogger(__name__)

ENGINE_HOST = "127.0.0.1"
ALL_ADDRESSES = frozenset({"0.0.0.0", "::", ""})
# Engines whose own key guards every path that can run or reveal inference (llama.cpp: all but /health and
# the model list). On a loopback serving address these need no pass-through; every other engine does.
KEY_GUARDS_EVERY_PATH = frozenset({"llamacpp"})
# Engines that would take their key only on argv (readable by every local user): behind the pass-through they
# get none, and the pass-through is the check.
KEY_ON_ARGV = frozenset({"sglang"})

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def needs_passthrough(engine: str, serving_host: str) -> bool:
    """A pure decision: does this engine, served on this address, need the agent in front of it?"""
    return not (is_loopback(serving_host) and engine in KEY_GUARDS_EVERY_PATH)


def authorized(header: str | None, digest: str | None) -> bool:
    """Whether an Authorization header carries the key whose digest is `digest` (None: the replica has none)."""
    if digest is None:
        return True
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return hmac.compare_digest(key_digest(token.strip()), digest)


def _unauthorized() -> web.Response:
    body = {
        "error": {
            "message": "This engine needs its key: send `Authorization: Bearer KEY`.",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    return web.Response(status=401, text=json.dumps(body), content_type="application/json")


def _forwarded(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in _HOP_BY_HOP:
            out.add(name, value)
    return out


class PassThrough:
    """Listens on (listen_host, listen_port) and forwards to 127.0.0.1:engine_port after the key check."""

    def __init__(self, listen_host: str, listen_port: int, engine_port: int, digest: str | None) -> None:
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.engine_port = engine_port
        self.digest = digest
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=0)  # bodies are streamed, never read whole
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # No read timeout of our own: the router owns deadlines, and a long generation is not idle.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        host = None if self.listen_host in ALL_ADDRESSES else self.listen_host
        await web.TCPSite(runner, host, self.listen_port, reuse_address=True).start()
        self._runner = runner

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if not authorized(request.headers.get("Authorization"), self.digest):
            return _unauthorized()
        assert self._session is not None
        url = f"http://{ENGINE_HOST}:{self.engine_port}{request.rel_url}"
        body = request.content if request.body_exists else None
        try:
            upstream = await self._session.request(
                request.method, url, headers=_forwarded(request.headers), data=body, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as exc:
            log.info("pass-through %s: engine unreachable: %s", self.listen_port, exc)
            return web.Response(status=502, text="engine unreachable\n")
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            response.headers.extend(_forwarded(upstream.headers))
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            upstream.release()
