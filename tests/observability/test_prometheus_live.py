"""A real Prometheus runs the shipped configuration and rules against the router's real metrics app and the
controller's real metric registry, served on loopback: the targets come up, every rule loads and evaluates
without error, and alerts go pending from series exactly as the code exports them.

The registries are filled the way the controller and the router fill them; the processes themselves are
exercised by their own tests and by the end-to-end test of `llmgw up`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from llmgw_router.app import create_metrics_app
from llmgw_router.path.service import Router
from llmgw_router.server.errors import ApiError
from prometheus_client import CollectorRegistry, generate_latest
from ruamel.yaml import YAML
from support import free_port, wait_for

from llmgw.controller.parts.metrics import ControllerMetrics

from .tools import require_tool

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "observability"
DEADLINE_S = 120.0  # Prometheus starts in well under a second when idle; the shared machine can be very busy


@pytest.fixture(scope="module")
def prometheus_bin() -> str:
    return require_tool("prometheus")


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"{host}:{port}"


def _registry_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def _config_for(targets: dict[str, str], rules: Path) -> dict[str, Any]:
    """The shipped prometheus.yml with its targets pointed at the test's listeners and a fast clock."""
    config: dict[str, Any] = YAML(typ="safe").load((KIT / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(rules)]
    for job in config["scrape_configs"]:
        job["scrape_interval"] = "1s"
        job["static_configs"][0]["targets"] = [targets[job["job_name"]]]
    return config


@pytest.fixture
async def exporters() -> AsyncIterator[tuple[ControllerMetrics, Router, dict[str, str]]]:
    # The router's own metrics app; the controller's registry alone, since its app recomputes the state
    # gauges from a running controller on every scrape (the controller's tests cover that wiring).
    router = Router()
    controller = ControllerMetrics()
    runners = []
    targets = {}
    for job, app in (
        ("llmgw-controller", _registry_app(controller.registry)),
        ("llmgw-router", create_metrics_app(router)),
    ):
        runner, address = await _serve(app)
        runners.append(runner)
        targets[job] = address
    yield controller, router, targets
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def prometheus(
    prometheus_bin: str, exporters: tuple[ControllerMetrics, Router, dict[str, str]], tmp_path: Path
) -> AsyncIterator[str]:
    rules = tmp_path / "alerts.rules.yml"
    rules.write_text((KIT / "alerts.rules.yml").read_text())
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps(_config_for(exporters[2], rules)))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        prometheus_bin,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


async def _api(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return None
            body = await resp.json()
            return body["data"]
    except aiohttp.ClientError:
        return None  # not listening yet


async def test_real_prometheus_loads_the_kit_and_alerts_on_exported_series(
    exporters: tuple[ControllerMetrics, Router, dict[str, str]], prometheus: str
) -> None:
    controller, router, _ = exporters
    # A refused revision and a Lost node, set as the controller sets them; the repo is readable and one
    # node is Ready, so the alerts on those stay quiet.
    controller.revision_refused.set(1)
    controller.source_up.set(1)
    controller.sync_status.labels("OutOfSync").set(1)
    for state, count in (("Ready", 1), ("Unreachable", 0), ("Lost", 1)):
        controller.nodes.labels(state).set(count)
    router.metrics.requests.labels("sim-chat", "200", "").inc()
    # A router holding usage records the store has not taken (set from the writer in llmgw_router.main).
    router.metrics.usage_pending.set_function(lambda: 5000)
    # A router whose admission queue is full refuses every request: through its own admission path, so the
    # reason label is the one the code writes.
    router.admission.queue_size = 0

    async def refuse_forever() -> None:
        while True:
            with contextlib.suppress(ApiError):
                await router.admission.wait("sim-chat", lambda: False, 1.0)
            await asyncio.sleep(0.1)

    refusing = asyncio.create_task(refuse_forever())

    async with aiohttp.ClientSession() as session:

        async def targets_up() -> Any:
            data = await _api(session, f"{prometheus}/api/v1/targets")
            if not data:
                return None
            health = {t["labels"]["job"]: t["health"] for t in data["activeTargets"]}
            return health if health == {"llmgw-controller": "up", "llmgw-router": "up"} else None

        async def rules_evaluated() -> Any:
            data = await _api(session, f"{prometheus}/api/v1/rules")
            if not data:
                return None
            rules = [r for g in data["groups"] for r in g["rules"]]
            evaluated = all(r.get("lastEvaluation", "").startswith("20") for r in rules)
            return rules if rules and evaluated else None

        async def pending_alerts() -> Any:
            data = await _api(session, f"{prometheus}/api/v1/alerts")
            names = {a["labels"]["alertname"] for a in data["alerts"]} if data else set()
            expected = {
                "LlmgwRevisionRefused",
                "LlmgwNodeLost",
                "LlmgwAdmissionQueueSaturated",
                "LlmgwUsageNotWritten",
            }
            return names if expected <= names else None

        await wait_for(targets_up, DEADLINE_S, "both targets up", interval=0.2)
        rules = await wait_for(rules_evaluated, DEADLINE_S, "every rule evaluated once", interval=0.2)
        shipped = YAML(typ="safe").load((KIT / "alerts.rules.yml").read_text())
        assert {r["name"] for r in rules} == {r["alert"] for g in shipped["groups"] for r in g["rules"]}
        assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []

        try:
            names = await wait_for(
                pending_alerts,
                DEADLINE_S,
                "the refused revision, the lost node, the full queue and the usage backlog to alert",
                interval=0.2,
            )
        finally:
            refusing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refusing
        # Quiet where nothing is wrong: the repo is readable, both scrape targets answer.
        assert "LlmgwClusterRepoUnreachable" not in names
        assert "LlmgwControllerDown" not in names
        assert "LlmgwRouterDown" not in names
