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
from llmgw_router.path.service import Router
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
                    prometheus_bin,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
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


async def test_prometheus_scrapes_an_agent_found_through_http_sd_and_the_node_rules_evaluate(
    tmp_path: Path,
) -> None:
    """A real agent with its node-health listener registers; the controller's http_sd lists it with its node
    name; a real Prometheus finds and scrapes it, and the shipped rules (the node group included) evaluate on
    its series without error."""
    from controller.helpers import Agents

    prometheus_bin = require_tool("prometheus")
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(unreachable="10s", lost="60s")})
    running, admin = await start(settings_for(tmp_path, repo.path))
    agents = Agents(tmp_path, tmp_path / "token")
    proc = None
    try:
        agents.start("gpu-1", running.url.removeprefix("http://"), extra={"metrics_listen": "127.0.0.1:0"})
        groups = await wait_for(lambda: _agent_groups(admin), 60, "the agent listed in http_sd")
        assert [g["labels"]["llmgw_node"] for g in groups] == ["gpu-1"]
        token = tmp_path / "prometheus-token"
        token.write_text(running.admin_token)
        rules = tmp_path / "alerts.rules.yml"
        rules.write_text((Path(__file__).parents[2] / "observability" / "alerts.rules.yml").read_text())
        sd = {
            "url": running.url + "/api/v1/prometheus/targets",
            "refresh_interval": "1s",
            "authorization": {"type": "Bearer", "credentials_file": str(token)},
        }
        keep_agents = [{"source_labels": ["llmgw_component"], "regex": "agent", "action": "keep"}]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "llmgw-agent", "http_sd_configs": [sd], "relabel_configs": keep_agents}
            ],
        }
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))
        prom_port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            prometheus_bin,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        base = f"http://127.0.0.1:{prom_port}/api/v1"
        async with aiohttp.ClientSession() as s:

            async def scraped() -> Any:
                found = await _query(s, base, 'llmgw_agent_info{llmgw_node="gpu-1"}')
                return found or None

            try:
                (series,) = await wait_for(scraped, 90, "Prometheus holding the agent's llmgw_agent_info")
            except AssertionError as exc:
                logged = (tmp_path / "prometheus.log").read_text()[-3000:]
                raise AssertionError(f"{exc}; log: {logged}") from None
            assert series["metric"]["node"] == "gpu-1" and series["metric"]["job"] == "llmgw-agent"
            free = await _query(s, base, 'llmgw_agent_filesystem_free_bytes{role="weights"}')
            assert free and float(free[0]["value"][1]) > 0

            async def node_rules_evaluated() -> Any:
                async with s.get(base + "/rules") as r:
                    data = await r.json()
                group = next(g for g in data["data"]["groups"] if g["name"] == "llmgw-node")
                done = all(rule.get("lastEvaluation", "").startswith("20") for rule in group["rules"])
                return group if done and group["rules"][0]["evaluationTime"] > 0 else None

            group = await wait_for(node_rules_evaluated, 60, "the node rules evaluated")
            assert [(r["name"], r["health"], r.get("lastError", "")) for r in group["rules"]] == [
                (r["name"], "ok", "") for r in group["rules"]
            ]
            # A healthy node raises none of them. (Pending is allowed: seconds of samples on a disk other
            # tests write to can point predict_linear anywhere, which is what the disk rule's hour is for.)
            assert [r["name"] for r in group["rules"] if r["state"] == "firing"] == []
    finally:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await proc.wait()
        agents.cleanup()
        await running.stop()


async def _agent_groups(admin: Any) -> Any:
    groups = await admin.get("/api/v1/prometheus/targets")
    return [g for g in groups if g["labels"]["llmgw_component"] == "agent"] or None


async def _query(s: aiohttp.ClientSession, base: str, query: str) -> list[dict[str, Any]]:
    try:
        async with s.get(base + "/query", params={"query": query}) as r:
            if r.status != 200:
                return []
            return list((await r.json())["data"]["result"])
    except aiohttp.ClientError:
        return []
