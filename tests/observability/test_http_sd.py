"""A real Prometheus (Debian's) finds the fleet through the controller's http_sd endpoint and scrapes it: the
controller's own metrics listener, and a router subscribed to the controller's stream, at the address it
connected from with the port the Cluster declares. The router here is its real metrics app and a subscription
on the router wire opened by the test (the router's own link is tested in tests/router)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from controller.helpers import Repo, cluster_yaml, settings_for, start
from llmgw_router.app import create_metrics_app
from llmgw_router.service import Router
from support import free_port, wait_for

from llmgw.controller.app import ROUTER_PATH

from .tools import require_tool

pytestmark = pytest.mark.integration


async def test_prometheus_discovers_the_controller_and_its_routers_through_http_sd(tmp_path: Path) -> None:
    prometheus_bin = require_tool("prometheus")
    router_port = free_port()
    cluster = (
        cluster_yaml(unreachable="10s", lost="60s")
        + f"  router:\n    metrics_listen: 127.0.0.1:{router_port}\n"
    )
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster})
    running, admin = await start(settings_for(tmp_path, repo.path))
    router_metrics = web.AppRunner(create_metrics_app(Router()))
    await router_metrics.setup()
    await web.TCPSite(router_metrics, "127.0.0.1", router_port).start()
    proc = None
    try:
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"Bearer {running.admin_token}"}
            ws = await s.ws_connect(running.url + ROUTER_PATH, headers=headers)  # a router subscribing
            reader = asyncio.get_running_loop().create_task(_drain(ws))  # answers the stream's pings
            try:
                groups = await wait_for(lambda: _groups(admin, 2), what="two target groups")
                by_kind = {g["labels"]["llmgw_component"]: g["targets"] for g in groups}
                assert by_kind["router"] == [f"127.0.0.1:{router_port}"]
                assert by_kind["controller"] == [running.metrics_url.removeprefix("http://")]  # type: ignore[union-attr]

                # Prometheus 2.42 sends a credentials file as it is (a trailing newline breaks the token), and
                # in http_sd without `type: Bearer` it sends no type at all.
                token = tmp_path / "prometheus-token"
                token.write_text(running.admin_token)
                sd = {
                    "url": running.url + "/api/v1/prometheus/targets",
                    "refresh_interval": "1s",
                    "authorization": {"type": "Bearer", "credentials_file": str(token)},
                }
                config = {
                    "global": {"scrape_interval": "1s"},
                    "scrape_configs": [{"job_name": "llmgw", "http_sd_configs": [sd]}],
                }
                (tmp_path / "prometheus.yml").write_text(json.dumps(config))
                prom_port = free_port()
                log = (tmp_path / "prometheus.log").open("wb")
                proc = await asyncio.create_subprocess_exec(
                    prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                    stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
                log.close()
                api = f"http://127.0.0.1:{prom_port}/api/v1/targets"
                last: list[Any] = []

                async def scraped() -> Any:
                    last[:] = await _targets(s, api)
                    health = {t["labels"].get("llmgw_component"): t["health"] for t in last}
                    return health if health == {"controller": "up", "router": "up"} else None

                try:
                    await wait_for(scraped, 90, "Prometheus scraping the discovered controller and router")
                except AssertionError as exc:  # say what Prometheus saw and logged
                    logged = (tmp_path / "prometheus.log").read_text()[-3000:]
                    raise AssertionError(f"{exc}; targets: {last}; log: {logged}") from None
            finally:
                await ws.close()
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
    finally:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await proc.wait()
        await router_metrics.cleanup()
        await running.stop()


async def _drain(ws: aiohttp.ClientWebSocketResponse) -> None:
    async for _ in ws:
        pass


async def _groups(admin: Any, n: int) -> Any:
    groups = await admin.get("/api/v1/prometheus/targets")
    return groups if len(groups) >= n else None


async def _targets(s: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    try:
        async with s.get(url) as r:
            if r.status != 200:
                return []
            return list((await r.json())["data"]["activeTargets"])
    except aiohttp.ClientError:
        return []
