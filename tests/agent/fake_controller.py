"""A tiny controller for agent tests: accepts (or refuses) agents on /agent/v1, records messages, sends commands."""

from __future__ import annotations

import asyncio
import itertools
import ssl
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from llmgw_agent.protocol import (
    AGENT_PATH,
    Command,
    Heartbeat,
    Refused,
    Register,
    Reply,
    ShardStatus,
    ShardUpdate,
    Welcome,
    dump,
    parse_agent_message,
)


@dataclass
class FakeController:
    token: str | None = None
    refuse: str | None = None
    heartbeat_interval_s: float = 0.2
    registers: list[Register] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    updates: list[ShardStatus] = field(default_factory=list)
    auth_seen: list[str] = field(default_factory=list)
    peer_certs: list[Any] = field(default_factory=list)
    ws: web.WebSocketResponse | None = None
    replies: dict[str, asyncio.Future[Reply]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    runner: web.AppRunner | None = None
    url: str = ""

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> str:
        app = web.Application()
        app.router.add_get(AGENT_PATH, self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.runner is not None:
            await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.auth_seen.append(request.headers.get("Authorization", ""))
        if request.transport is not None:
            self.peer_certs.append(request.transport.get_extra_info("peercert"))
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.Response(status=401, text="bad token")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for raw in ws:
            if raw.type != WSMsgType.TEXT:
                break
            msg = parse_agent_message(raw.data)
            if isinstance(msg, Register):
                self.registers.append(msg)
                if self.refuse:
                    await ws.send_str(dump(Refused(reason=self.refuse)))
                    await ws.close()
                    break
                self.ws = ws
                await ws.send_str(dump(Welcome(heartbeat_interval_s=self.heartbeat_interval_s)))
            elif isinstance(msg, Heartbeat):
                self.heartbeats.append(msg)
            elif isinstance(msg, ShardUpdate):
                self.updates.append(msg.shard)
            elif isinstance(msg, Reply) and msg.id in self.replies:
                self.replies.pop(msg.id).set_result(msg)
        return ws

    async def command(self, action: str, **kw: Any) -> Reply:
        assert self.ws is not None, "no agent connected"
        cid = f"c{next(self._ids)}"
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.replies[cid] = fut
        await self.ws.send_str(dump(Command.model_validate({"id": cid, "action": action, **kw})))
        return await asyncio.wait_for(fut, timeout=60)

    def last_update(self, replica_id: str) -> ShardStatus | None:
        for status in reversed(self.updates):
            if status.replica_id == replica_id:
                return status
        return None
