"""The key-checking pass-through in front of each engine: the only socket routers reach.

Engines listen on 127.0.0.1; the agent listens on the node's serving address and forwards every request whose
`Authorization: Bearer KEY` matches the replica's engine key. The check covers every path, because engines'
own keys do not: vLLM guards only its API prefixes (`/invocations`, `/pooling`, `/score`, `/metrics` are open),
SGLang leaves `/metrics` open, TRT-LLM has no key at all. Bodies stream both ways chunk by chunk, never buffered,
so a token the engine writes reaches the router as soon as it is read.

An engine asked for KV-cache events publishes them on 127.0.0.1 only (`--kv-events-port E`); the pass-through
serves them to key holders at `/llmgw/kv-events` (kv_relay.py), a path it never forwards.

It runs as `python -m llmgw_agent.passthrough --listen-host H --listen-port P --engine-port Q -- ENGINE ARGV`:
the agent starts that in the engine's place, in the engine's session and process group, and it starts the engine
as its child. So it lives exactly as long as the engine: it survives an agent restart or a frozen agent (traffic
goes on, as it did when routers reached engines directly), is re-adopted with the engine, stops with the
group, and exits with the engine's status. It is given only the key's SHA-256 digest, by environment (removed
before the engine starts), never the key.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from llmgw_agent.kv_relay import RELAY_PATH, KvEventRelay

log = logging.getLogger(__name__)

ENGINE_HOST = "127.0.0.1"
DIGEST_ENV = "LLMGW_ENGINE_KEY_SHA256"
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

    def __init__(
        self,
        listen_host: str,
        listen_port: int,
        engine_port: int,
        digest: str | None,
        kv_events_port: int | None = None,
    ) -> None:
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.engine_port = engine_port
        self.digest = digest
        self.relay = KvEventRelay(kv_events_port) if kv_events_port is not None else None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=0)  # bodies are streamed, never read whole
        app.router.add_route("*", RELAY_PATH, self._relay)  # before the catch-all: never the engine's
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

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        if not authorized(request.headers.get("Authorization"), self.digest):
            return _unauthorized()
        if self.relay is None:
            body = {"error": {"message": "This replica publishes no KV events.", "type": "not_found_error"}}
            return web.Response(status=404, text=json.dumps(body), content_type="application/json")
        return await self.relay.handle(request)

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


def fronted_argv(
    python: str,
    listen_host: str,
    listen_port: int,
    engine_port: int,
    engine: Sequence[str],
    kv_events_port: int | None = None,
) -> list[str]:
    """The command that runs `engine` behind a pass-through on (listen_host, listen_port), relaying the KV
    events it publishes on 127.0.0.1:`kv_events_port` (None: it publishes none).

    The pass-through imports this very package from where the agent has it: the environment it starts with is
    the engine's, whose PYTHONPATH (an engine's own, e.g. SGLang's) may not hold the agent."""
    here = str(Path(__file__).resolve().parent.parent)
    code = f"import sys; sys.path.insert(0, {here!r}); from llmgw_agent.passthrough import main; main()"
    head = [python, "-c", code, "--listen-host", listen_host]
    events = ["--kv-events-port", str(kv_events_port)] if kv_events_port is not None else []
    ports = ["--listen-port", str(listen_port), "--engine-port", str(engine_port), *events]
    return [*head, *ports, "--", *engine]


async def _front(ns: argparse.Namespace, command: list[str], digest: str | None) -> int:
    front = PassThrough(ns.listen_host, ns.listen_port, ns.engine_port, digest, ns.kv_events_port)
    try:
        await front.start()  # before the engine: by the time it is healthy, routers can reach it
    except OSError as exc:
        print(f"llmgw pass-through: cannot listen on {ns.listen_host}:{ns.listen_port}: {exc}", flush=True)
        return 1
    print(
        f"llmgw pass-through: {ns.listen_host}:{ns.listen_port} -> {ENGINE_HOST}:{ns.engine_port}", flush=True
    )
    engine = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.DEVNULL)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # The group got the signal too; wait for the engine to finish its own shutdown, then go.
        loop.add_signal_handler(sig, lambda: None)
    code = await engine.wait()
    await front.close()
    return code


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m llmgw_agent.passthrough", description=__doc__)
    p.add_argument("--listen-host", required=True)
    p.add_argument("--listen-port", type=int, required=True)
    p.add_argument("--engine-port", type=int, required=True)
    p.add_argument("--kv-events-port", type=int, help="the engine's KV-event publisher on 127.0.0.1, relayed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- ENGINE ARGV")
    ns = p.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        p.error("give the engine's command after --")
    digest = os.environ.pop(DIGEST_ENV, None) or None
    logging.basicConfig(level=logging.WARNING, format="llmgw pass-through: %(message)s")
    code = asyncio.run(_front(ns, command, digest))
    if code < 0:  # killed by a signal: die of the same one, so the agent reports it as such
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
