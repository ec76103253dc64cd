"""The controller's stream: a WebSocket at ws://CONTROLLER/router/v1.

Down (controller -> router): a complete RouterSnapshot as JSON on connect and on every change (either bare or
wrapped as {"type": "snapshot", "snapshot": {...}}). Up (router -> controller), as llmgw.controller.wire.publisher reads:
  {"type": "demand", "model": NAME}        an on-demand model was asked for (sent again while it stays asked)
  {"type": "usage", "models": [NAME...]}  every use_interval, the models used since the last message
  {"type": "load", "models": {NAME: {"queued": int, "inflight": int, "ttft_p99_ms": float|null,
   "refused": int}}, "replicas": {ID: {"inflight": int, "last_request_at": float|null, "routed": bool}}}
                                          every load_interval: the autoscaler's demand and the drains'
                                          "nothing in flight" (llmgw_router.fleet.load says what each field means)
While disconnected the router keeps serving the last snapshot and reconnects with a capped backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from pydantic import ValidationError

from llmgw.core.errors import Outage, TransientError, retry_after
from llmgw.core.snapshot import RouterSnapshot

__all__ = ["ControllerLink", "ControllerUnreachable", "controller_url"]

log = logging.getLogger(__name__)


class ControllerUnreachable(TransientError):
    """The controller's stream could not be opened, or was lost; `delay` None: the link's own backoff."""


def controller_url(address: str) -> str:
    """`host:port`, `http://host:port` or a full ws URL -> the router stream's ws:// URL."""
    if address.startswith(("ws://", "wss://")):
        return address
    if address.startswith("http://"):
        address = "ws://" + address.removeprefix("http://")
    elif address.startswith("https://"):
        address = "wss://" + address.removeprefix("https://")
    else:
        address = "ws://" + address
    return address.rstrip("/") + "/router/v1"


class ControllerLink:
    """ControllerCallbacks over the stream, plus the loop that keeps it connected."""

    def __init__(
        self,
        url: str | Sequence[str],
        router_id: str,
        token: str | None,
        on_snapshot: Callable[[RouterSnapshot], None],
        last_used: Callable[[], dict[str, float]],
        on_connected: Callable[[bool], None] = lambda _: None,
        use_interval: float = 10.0,
        max_backoff: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        load: Callable[[], dict[str, Any]] | None = None,
        load_interval: float = 1.0,
    ) -> None:
        # Several addresses with standby controllers: tried in turn; a standby refuses the stream (503) and a
        # dead one does not answer, and the answer to both is the next address.
        self.urls = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise ValueError("ControllerLink needs at least one controller address")
        self._index = 0
        # With the cluster CA: its certificate to verify the controller, and this router's (router:NAME).
        self._ssl = ssl_context
        self.router_id = router_id
        self._token = token
        self._on_snapshot = on_snapshot
        self._last_used = last_used
        self._on_connected = on_connected
        self._use_interval = use_interval
        # Load goes more often than usage: the autoscaler must see a burst within seconds, not tens of them.
        self._load = load
        self._load_interval = load_interval
        self._max_backoff = max_backoff
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1000)
        self.revision: str | None = None
        # Said once per outage, not per attempt (a standby refusing, every address in turn, every backoff).
        self._lost = Outage(log, "the controller stream (serving the last snapshot meanwhile)")

    @property
    def url(self) -> str:
        """The address in use (or tried next)."""
        return self.urls[self._index % len(self.urls)]

    def request_load(self, model: str) -> None:
        try:
            self._outbox.put_nowait({"type": "demand", "model": model})
        except asyncio.QueueFull:
            log.warning(
                "controller outbox full; load request for %s dropped (it is asked again later)", model
            )

    async def run(self, session: aiohttp.ClientSession) -> None:
        backoff = 0.2
        while True:
            wait = backoff * (0.5 + random.random())
            try:
                await self._session(session)
                backoff = 0.2  # a session that worked starts the backoff again
                wait = backoff * (0.5 + random.random())
            except ControllerUnreachable as exc:
                wait = retry_after(exc, default=wait, most=self._max_backoff)
                self._lost.failed(exc, wait)
            finally:
                self._on_connected(False)
            self._index += 1
            if len(self.urls) > 1 and self._index % len(self.urls):
                await self._pause(0.05)  # the next address has not been tried yet: no reason to wait
                continue
            await self._pause(wait)
            backoff = min(backoff * 2, self._max_backoff)

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _session(self, session: aiohttp.ClientSession) -> None:
        try:
            await self._stream(session)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ControllerUnreachable(f"controller stream {self.url}: {exc}") from exc

    async def _stream(self, session: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        tls: ssl.SSLContext | bool = self._ssl if self._ssl is not None else True
        async with session.ws_connect(self.url, headers=headers, heartbeat=10.0, ssl=tls) as ws:
            log.info("connected to the controller at %s", self.url)
            self._lost.recovered()
            self._on_connected(True)
            sender = asyncio.create_task(self._send(ws))
            try:
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        self._receive(msg.data)
                    elif msg.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE):
                        break
            finally:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)

    def _receive(self, text: str) -> None:
        try:
            raw = json.loads(text)
            if isinstance(raw, dict) and raw.get("type") == "snapshot":
                raw = raw.get("snapshot")
            elif isinstance(raw, dict) and "type" in raw:
                return  # a message kind this router does not know: ignored, not fatal
            snapshot = RouterSnapshot.model_validate(raw)
        except (ValueError, ValidationError) as exc:
            log.warning("controller sent a snapshot this router cannot read; keeping the last one: %s", exc)
            return
        try:
            self._on_snapshot(snapshot)
        except ValueError as exc:
            log.warning("snapshot %s refused; keeping the last one: %s", snapshot.revision, exc)
            return
        self.revision = snapshot.revision

    async def _send(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        reported: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        usage_due = loop.time() + self._use_interval
        load_due = loop.time() if self._load is not None else float("inf")
        while True:
            try:
                async with asyncio.timeout(max(0.0, min(usage_due, load_due) - loop.time())):
                    msg = await self._outbox.get()
                await ws.send_json(msg)
                continue
            except TimeoutError:
                pass
            now = loop.time()
            if self._load is not None and now >= load_due:
                await ws.send_json(self._load())
                load_due = now + self._load_interval
            if now < usage_due:
                continue
            usage_due = now + self._use_interval
            fresh = {m: t for m, t in self._last_used().items() if reported.get(m) != t}
            if fresh:
                await ws.send_json({"type": "usage", "models": sorted(fresh)})
                reported.update(fresh)
