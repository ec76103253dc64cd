"""A local HTTP origin whose files change, for the weights-update tests: an aiohttp server in the HF layout
(`/{repo}/resolve/{revision}/{file}`, naming its commit in X-Repo-Commit and each file's sha256 in X-Linked-Etag,
as the Hub does) and a plain file URL with a sha256 ETag. It runs on its own loop in a thread, so both the CLI
(which runs its own loop) and agents in other processes can ask it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import Iterator

from aiohttp import web

from llmgw.core.weights.manifest import ManifestFile, manifest_json

__all__ = ["Origin", "files_of", "running_app", "running_origin"]


class Origin:
    """Files by commit; `main` is the commit last pushed. Every GET of a file is counted (`gets`)."""

    def __init__(self, repo: str = "org/small") -> None:
        self.repo = repo
        self.commits: dict[str, dict[str, bytes]] = {}
        self.main = ""
        self.plain = b""  # /files/tiny.gguf
        self.gets: dict[str, int] = {}  # "{commit}/{file}" -> GETs of it (not HEADs)
        self.corrupt: set[str] = (
            set()
        )  # file names whose GET sends other bytes than HEAD named (a bad CDN copy)
        self.loop = asyncio.new_event_loop()
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, commit: str, files: dict[str, bytes]) -> None:
        self.commits[commit], self.main = files, commit

    def _commit(self, revision: str) -> str:
        if revision == "main":
            return self.main
        return next((c for c in self.commits if c.startswith(revision)), "")

    async def resolve(self, request: web.Request) -> web.Response:
        commit = self._commit(request.match_info["rev"])
        files = self.commits.get(commit, {})
        name = request.match_info["file"]
        if name == "llmgw-manifest.json" and files:  # as the mirror publishes it
            return web.json_response(manifest_json(files_of(files)))
        body = files.get(name)
        if request.match_info["repo"] != self.repo or body is None:
            raise web.HTTPNotFound()
        sha = hashlib.sha256(body).hexdigest()
        if request.method == "GET":
            self.gets[f"{commit}/{name}"] = self.gets.get(f"{commit}/{name}", 0) + 1
            if name in self.corrupt:
                body = bytes(b ^ 1 for b in body)  # the same size, other bytes
        return web.Response(body=body, headers={"X-Repo-Commit": commit, "X-Linked-Etag": f'"{sha}"'})

    async def plain_file(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.plain, headers={"ETag": f'"{hashlib.sha256(self.plain).hexdigest()}"'})

    async def _start(self) -> None:
        server = web.Application()
        server.router.add_get("/{repo:.+}/resolve/{rev}/{file}", self.resolve)
        server.router.add_get("/files/tiny.gguf", self.plain_file)
        self.runner = web.AppRunner(server, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
            self.runner = None


@contextlib.contextmanager
def running_origin() -> Iterator[Origin]:
    o = Origin()
    thread = threading.Thread(target=o.loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(o._start(), o.loop).result(30)
    try:
        yield o
    finally:
        o.stop()
        o.loop.call_soon_threadsafe(o.loop.stop)
        thread.join(30)
        o.loop.close()


@contextlib.contextmanager
def running_app(app: web.Application) -> Iterator[str]:
    """`app` (a mirror, say) served on its own loop in a thread, as the origin is; yields its URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)

    async def start() -> str:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def files_of(contents: dict[str, bytes]) -> list[ManifestFile]:
    return [ManifestFile(n, len(b), hashlib.sha256(b).hexdigest()) for n, b in sorted(contents.items())]
