"""A stand-in ComfyUI server: ComfyUI's HTTP and websocket API (its server.py), with a queue that runs one
workflow at a time and makes small real PNGs instead of pictures worth the wait.

What it speaks, as ComfyUI does: `POST /prompt {"prompt", "client_id"}` answers `{"prompt_id", "number",
"node_errors"}` (400 with `error` for a workflow without an output node or with a node lacking its class);
`GET /queue` lists `queue_running` and `queue_pending` as `[number, prompt_id, prompt, extra_data, outputs]`;
`POST /queue {"delete": [ids]}` takes pending ones off; `POST /interrupt` (optionally `{"prompt_id"}`: only
that one) stops the running one; `GET /history/{id}` and `GET /view?filename=&subfolder=&type=`. The websocket
`/ws?clientId=` gets `status` at connect, then for its own workflows `execution_start`, `executing` per node,
`executed` for the save node, `execution_success` and `executing` with `node: null`, or
`execution_interrupted`.

`hold()` keeps a started workflow running until `release()` (what a test of a client leaving needs).
"""

from __future__ import annotations

import asyncio
import struct
import uuid
import zlib
from typing import Any

from aiohttp import web

__all__ = ["ComfyStandIn", "png"]


def png(seed: int, side: int = 4) -> bytes:
    """A side x side RGB PNG of one colour drawn from `seed`: a real picture, different per seed."""
    r, g, b = seed & 0xFF, (seed >> 8) & 0xFF, (seed >> 16) & 0xFF
    raw = b"".join(b"\x00" + bytes((r, g, b)) * side for _ in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


class ComfyStandIn:
    def __init__(self) -> None:
        self.pending: list[list[Any]] = []  # [number, prompt_id, prompt, extra_data, outputs]
        self.running: list[Any] | None = None
        self.history: dict[str, Any] = {}
        self.files: dict[str, bytes] = {}
        self.clients: dict[str, web.WebSocketResponse] = {}
        self.received: list[dict[str, Any]] = []  # the workflows queued, as sent
        self.deleted: list[str] = []
        self.interrupted: list[str] = []
        self._number = 0
        self._wake = asyncio.Event()
        self._released = asyncio.Event()
        self._released.set()
        self._interrupt = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._worker: asyncio.Task[None] | None = None
        self.url = ""

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/prompt", self._prompt)
        app.router.add_get("/queue", self._queue)
        app.router.add_post("/queue", self._queue_action)
        app.router.add_post("/interrupt", self._interrupt_action)
        app.router.add_get("/history/{prompt_id}", self._history)
        app.router.add_get("/view", self._view)
        app.router.add_get("/ws", self._ws)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._worker = asyncio.create_task(self._work())
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for ws in list(self.clients.values()):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # ------------------------------------------------------------------ HTTP

    async def _prompt(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt, client_id = body.get("prompt"), body.get("client_id")
        if not isinstance(prompt, dict):
            return _refusal("invalid_prompt", "the prompt is not an object of nodes")
        for node_id, node in prompt.items():
            if not isinstance(node, dict) or "class_type" not in node:
                return _refusal("invalid_prompt", f"Cannot execute because node {node_id} has no class_type")
        outputs = [k for k, v in prompt.items() if v["class_type"] == "SaveImage"]
        if not outputs:
            return _refusal("prompt_no_outputs", "Prompt has no outputs")
        self.received.append(prompt)
        self._number += 1
        prompt_id = str(uuid.uuid4())
        self.pending.append([self._number, prompt_id, prompt, {"client_id": client_id}, outputs])
        self._wake.set()
        return web.json_response({"prompt_id": prompt_id, "number": self._number, "node_errors": {}})

    async def _queue(self, request: web.Request) -> web.Response:
        running = [self.running] if self.running is not None else []
        return web.json_response({"queue_running": running, "queue_pending": self.pending})

    async def _queue_action(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("clear"):
            self.pending.clear()
        for prompt_id in body.get("delete", []):
            self.deleted.append(prompt_id)
            self.pending = [item for item in self.pending if item[1] != prompt_id]
        return web.Response(status=200)

    async def _interrupt_action(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        wanted = body.get("prompt_id") if isinstance(body, dict) else None
        if self.running is not None and wanted in (None, self.running[1]):
            self.interrupted.append(self.running[1])
            self._interrupt.set()
        return web.Response(status=200)

    async def _history(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        found = self.history.get(prompt_id)
        return web.json_response({prompt_id: found} if found is not None else {})

    async def _view(self, request: web.Request) -> web.Response:
        q = request.query
        data = self.files.get(f"{q.get('type', 'output')}/{q.get('subfolder', '')}/{q.get('filename', '')}")
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="image/png")

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        client_id = request.query.get("clientId") or uuid.uuid4().hex
        self.clients[client_id] = ws
        await ws.send_json(
            {
                "type": "status",
                "data": {"status": {"exec_info": {"queue_remaining": len(self.pending)}}, "sid": client_id},
            }
        )
        async for _ in ws:  # ComfyUI reads nothing from its websocket clients
            pass
        self.clients.pop(client_id, None)
        return ws

    # ------------------------------------------------------------------ the queue

    async def _send(self, client_id: str | None, kind: str, data: dict[str, Any]) -> None:
        ws = self.clients.get(client_id or "")
        if ws is not None and not ws.closed:
            await ws.send_json({"type": kind, "data": data})

    async def _work(self) -> None:
        while True:
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.running = self.pending.pop(0)
            self._interrupt.clear()
            try:
                await self._execute(*self.running)
            finally:
                self.running = None

    async def _execute(
        self, number: int, prompt_id: str, prompt: dict[str, Any], extra: dict[str, Any], outputs: list[str]
    ) -> None:
        client = extra.get("client_id")
        await self._send(client, "execution_start", {"prompt_id": prompt_id, "timestamp": 0})
        for node_id in prompt:
            await self._send(
                client, "executing", {"node": node_id, "display_node": node_id, "prompt_id": prompt_id}
            )
        released = asyncio.create_task(self._released.wait())
        interrupted = asyncio.create_task(self._interrupt.wait())
        await asyncio.wait([released, interrupted], return_when=asyncio.FIRST_COMPLETED)
        released.cancel()
        interrupted.cancel()
        if self._interrupt.is_set():
            self.history[prompt_id] = {
                "prompt": [number, prompt_id, prompt, extra, outputs],
                "outputs": {},
                "status": {"status_str": "error", "completed": False, "messages": []},
            }
            await self._send(client, "execution_interrupted", {"prompt_id": prompt_id, "node_id": outputs[0]})
            return
        saved: dict[str, Any] = {}
        for node_id in outputs:
            images = []
            for i in range(_batch(prompt)):
                name = f"llmgw_{number:05}_{i}.png"
                self.files[f"output//{name}"] = png(_seed(prompt) + i)
                images.append({"filename": name, "subfolder": "", "type": "output"})
            saved[node_id] = {"images": images}
            await self._send(
                client,
                "executed",
                {"node": node_id, "display_node": node_id, "output": saved[node_id], "prompt_id": prompt_id},
            )
        self.history[prompt_id] = {
            "prompt": [number, prompt_id, prompt, extra, outputs],
            "outputs": saved,
            "status": {"status_str": "success", "completed": True, "messages": []},
        }
        await self._send(client, "execution_success", {"prompt_id": prompt_id, "timestamp": 0})
        await self._send(client, "executing", {"node": None, "prompt_id": prompt_id})


def _batch(prompt: dict[str, Any]) -> int:
    sizes = [n["inputs"].get("batch_size") for n in prompt.values() if "batch_size" in n.get("inputs", {})]
    return sizes[0] if sizes and isinstance(sizes[0], int) else 1


def _seed(prompt: dict[str, Any]) -> int:
    seeds = [n["inputs"]["seed"] for n in prompt.values() if isinstance(n.get("inputs", {}).get("seed"), int)]
    return seeds[0] if seeds else 0


def _refusal(kind: str, message: str) -> web.Response:
    error = {"type": kind, "message": message, "details": "", "extra_info": {}}
    return web.json_response({"error": error, "node_errors": {}}, status=400)
