"""The agent's metrics listener (`metrics_listen`): node health for Prometheus at GET /metrics.

Off unless configured: a node opens nothing for Prometheus it was not told to. A scrape measures the node in a
thread (nvidia-smi can take a second); scrapes closer together than `MIN_SAMPLE_AGE_S` share one sample, so
several Prometheus servers cannot make the agent run nvidia-smi in a loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence

from aiohttp import web

from llmgw_agent import health
from llmgw_agent.thermals import ThermalSampler

MIN_SAMPLE_AGE_S = 2.0


class Exporter:
    def __init__(
        self,
        *,
        version: str,
        node: str,
        paths: Callable[[], Sequence[tuple[str, str]]],
        engine_exits: Callable[[], Mapping[tuple[str, str], int]],
        smi_binary: str | None = None,
        thermals: ThermalSampler | None = None,
    ) -> None:
        self.version = version
        self.node = node
        self._paths = paths
        self._engine_exits = engine_exits
        self._smi_binary = smi_binary
        self._thermals = thermals
        self._last: health.Sample | None = None
        self._taken: float = 0.0
        self._lock = asyncio.Lock()
        self.runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None

    async def current(self) -> health.Sample:
        async with self._lock:
            if self._last is None or time.monotonic() - self._taken >= MIN_SAMPLE_AGE_S:
                paths = list(self._paths())
                self._last = await asyncio.to_thread(health.sample, paths, self._smi_binary)
                if self._thermals is not None:  # its own pace: at most one measure per 10 s
                    self._last.thermals = await asyncio.to_thread(self._thermals.sample)
                self._taken = time.monotonic()
            return self._last

    async def metrics(self, _: web.Request) -> web.Response:
        sample = await self.current()
        series = health.series_of(
            sample, version=self.version, node=self.node, engine_exits=self._engine_exits()
        )
        return web.Response(text=health.render(series), content_type="text/plain", charset="utf-8")

    async def start(self, listen: str) -> tuple[str, int]:
        host, _, port = listen.rpartition(":")
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, host.strip("[]") or "0.0.0.0", int(port)).start()
        bound = self.runner.addresses[0]
        self.address = (str(bound[0]), int(bound[1]))
        return self.address

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
