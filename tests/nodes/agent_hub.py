"""A stand-in for the controller's agent hub: TLS WebSocket on loopback, client certificate checked by the CA.

Accepts a Register only from a certificate whose CN names the same node, answers Welcome, and records when
each node registered (monotonic clock, as the bootstrap's `registered` predicate expects)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web
from llmgw_agent.protocol import AGENT_PATH, Refused, Register, Welcome, dump, parse_agent_message

from llmgw.adapters.ssh.ca import ClusterCA, PeerRejected


@dataclass
class HubStub:
    ca: ClusterCA
    registered_at: dict[str, float] = field(default_factory=dict)
    connected: set[str] = field(default_factory=set)
    refusals: list[str] = field(default_factory=list)
    runner: web.AppRunner | None = None
    port: int = 0
    sockets: set[web.WebSocketResponse] = field(default_factory=set)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(AGENT_PATH, self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.ca.server_context(["127.0.0.1"]))
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        # Open streams first: cleanup would otherwise wait for the agents to hang up (aiohttp's shutdown
        # timeout), as the real controller's stop avoids too.
        for ws in list(self.sockets):
            await ws.close()
        if self.runner is not None:
            await self.runner.cleanup()

    async def registered(self, node: str, since: float) -> bool:
        return node in self.connected and self.registered_at.get(node, float("-inf")) >= since

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.add(ws)
        try:
            return await self._session(request, ws)
        finally:
            self.sockets.discard(ws)

    async def _session(self, request: web.Request, ws: web.WebSocketResponse) -> web.WebSocketResponse:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        try:
            peer = self.ca.check_peer(ssl_object.getpeercert(binary_form=True) if ssl_object else None)
        except PeerRejected as exc:
            self.refusals.append(str(exc))
            await ws.send_str(dump(Refused(reason=str(exc))))
            await ws.close()
            return ws
        first = await ws.receive(timeout=10)
        message = parse_agent_message(first.data)
        if not isinstance(message, Register) or message.node != peer.node:
            reason = f"certificate names {peer.node}, register names {getattr(message, 'node', '?')}"
            self.refusals.append(reason)
            await ws.send_str(dump(Refused(reason=reason)))
            await ws.close()
            return ws
        await ws.send_str(dump(Welcome(heartbeat_interval_s=1.0)))
        self.registered_at[peer.node] = time.monotonic()
        self.connected.add(peer.node)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    break
        finally:
            self.connected.discard(peer.node)
        return ws
