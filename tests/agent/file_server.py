"""A real HTTP file server on loopback for weights tests: Range requests, 404s, and a connection cut mid-file.

`files` maps a URL path (`/org/model/resolve/main/config.json`) to bytes. `cut` maps a path to a byte count:
the first GET of it sends the full Content-Length, that many bytes, then drops the connection. Every request's
path, Range and Authorization header is recorded, and how many were in flight at once.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Seen:
    path: str
    range: str | None
    auth: str | None


@dataclass
class FileServer:
    files: dict[str, bytes] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)  # path -> absolute Location
    hold_s: float = 0.0  # how long a response is held open, so overlapping fetches overlap
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    runner: web.AppRunner | None = None
    base: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path, rng = request.path, request.headers.get("Range")
        self.seen.append(Seen(path, rng, request.headers.get("Authorization")))
        if path in self.redirects:
            raise web.HTTPFound(self.redirects[path])
        body = self.files.get(path)
        if body is None:
            raise web.HTTPNotFound()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hold_s:
                await asyncio.sleep(self.hold_s)
            return await self._send(request, path, body, rng)
        finally:
            self.in_flight -= 1

    async def _send(
        self, request: web.Request, path: str, body: bytes, rng: str | None
    ) -> web.StreamResponse:
        start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
        if start >= len(body) and rng:
            return web.Response(status=416)
        resp = web.StreamResponse(status=206 if rng else 200)
        resp.content_length = len(body) - start
        await resp.prepare(request)
        cut_at = self.cut.pop(path, None)
        if cut_at is not None:
            await resp.write(body[start:cut_at])
            assert request.transport is not None
            request.transport.close()  # mid-file: the client has fewer bytes than Content-Length promised
            return resp
        await resp.write(body[start:])
        await resp.write_eof()
        return resp

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.base

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def asked(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_files() -> dict[str, bytes]:
    """An HF-style directory: config, tokenizer under a subdirectory, two shards (512 KiB and 768 KiB)."""
    return {
        "config.json": b'{"architectures": ["Qwen2ForCausalLM"]}\n',
        "tokenizer/tokenizer.json": b'{"version": "1.0"}\n' * 50,
        "model-00001-of-00002.safetensors": bytes(range(256)) * 2048,
        "model-00002-of-00002.safetensors": bytes(reversed(range(256))) * 3072,
    }
