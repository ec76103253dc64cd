"""Failure handling against real processes: a replica killed mid-traffic, scrape contract violations, the
controller stream going away and coming back, and the router as its own process."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from llmgw_router.app import serve
from llmgw_router.decisions.scheduler import RequestInfo
from llmgw_router.fleet.link import ControllerLink, controller_url
from llmgw_router.fleet.scrape import scrape_once
from llmgw_router.path.service import Router, RouterOptions
from support import free_port, wait_for

from llmgw.adapters.keys import hash_key
from llmgw.core.snapshot import RouterSnapshot

from .helpers import endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration


def snap(endpoints: list[dict[str, Any]], revision: str = "r1", **extra: Any) -> RouterSnapshot:
    return RouterSnapshot.model_validate(
        {
            "revision": revision,
            "models": {"sim-kill": {"context_length": 4096}},
            "endpoints": endpoints,
            **extra,
        }
    )


async def test_a_replica_killed_mid_traffic_loses_no_request() -> None:
    sims = [start_sim("sim-kill", f"k{i}", decode_ms=5.0) for i in range(3)]
    try:
        wait_healthy_sync(sims)
        router = Router(RouterOptions())
        router.apply_snapshot(snap([endpoint(s, f"rep-{i}") for i, s in enumerate(sims)]))
        listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
        done = 0
        gate = asyncio.Semaphore(12)

        async def one(c: openai.AsyncOpenAI, i: int) -> int:
            nonlocal done
            async with gate:
                r = await c.completions.create(model="sim-kill", prompt=f"request {i}", max_tokens=10)
                done += 1
                return r.usage.completion_tokens if r.usage else 0

        try:
            async with openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{listeners.api_port}/v1",
                api_key="none",
                max_retries=0,
                timeout=60,
            ) as c:
                tasks = [asyncio.create_task(one(c, i)) for i in range(60)]
                await wait_for(lambda: done >= 12, 60, "traffic to be flowing")
                sims[0].kill()  # requests in flight on it and new ones sent to it must all still succeed
                results = await asyncio.gather(*tasks)
            assert results == [10] * 60
            table = router.table
            assert table is not None
            dead = table.endpoints["sim-kill"][0]
            assert dead.breaker.failures >= 1
            retries = router.metrics.registry.get_sample_value(
                "llmgw_router_retries_total", {"model": "sim-kill"}
            )
            assert retries is not None and retries >= 1
        finally:
            await listeners.close()
    finally:
        for s in sims:
            s.kill()


@pytest.fixture
async def fake_engine() -> AsyncIterator[tuple[dict[str, Any], str]]:
    """A metrics page whose text and status the test sets."""
    page: dict[str, Any] = {"status": 200, "text": "", "auth": None}

    async def metrics(request: web.Request) -> web.Response:
        page["auth"] = request.headers.get("Authorization")
        return web.Response(status=page["status"], text=page["text"])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield page, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


LLAMA_PAGE = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n"


async def test_violation_warns_once_and_once_when_it_clears(
    fake_engine: tuple[dict[str, Any], str], caplog: pytest.LogCaptureFixture
) -> None:
    page, url = fake_engine
    now = [1000.0]
    router = Router(RouterOptions(), clock=lambda: now[0])
    ep = {
        "replica_id": "llama-1",
        "model": "sim-kill",
        "engine": "llamacpp",
        "base_url": url,
        "api_key": "ek",
    }
    mapping = {
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
        "kv_usage": "llamacpp:kv_cache_usage_ratio",
    }
    router.apply_snapshot(snap([ep], metric_mappings={"llamacpp": mapping}))
    table = router.table
    assert table is not None
    live = table.endpoints["sim-kill"][0]
    page["text"] = LLAMA_PAGE
    caplog.set_level(logging.WARNING, logger="llmgw_router.fleet.scrape")
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            await scrape_once(session, table, router.metrics, router.clock)
        assert page["auth"] == "Bearer ek"  # llama.cpp guards /metrics with the engine key
        warnings = [r for r in caplog.records if "violation" in r.getMessage()]
        assert len(warnings) == 1 and "llamacpp:kv_cache_usage_ratio" in warnings[0].getMessage()
        assert (
            live.sample is not None and live.sample.running == 2
        )  # the metrics it does serve are still used
        value = router.metrics.registry.get_sample_value(
            "llmgw_router_metrics_contract_violations", {"endpoint": "llama-1", "model": "sim-kill"}
        )
        assert value == 1
        page["text"] = LLAMA_PAGE + "llamacpp:kv_cache_usage_ratio 0.5\n"
        for _ in range(2):
            await scrape_once(session, table, router.metrics, router.clock)
        cleared = [r for r in caplog.records if "cleared" in r.getMessage()]
        assert len(cleared) == 1 and live.violation == () and live.sample.kv_usage == 0.5

        # A failing metrics page is counted, never trips the breaker, and makes the endpoint stale in time.
        page["status"] = 500
        for _ in range(5):
            await scrape_once(session, table, router.metrics, router.clock)
        errors = router.metrics.registry.get_sample_value(
            "llmgw_router_scrape_errors_total", {"endpoint": "llama-1"}
        )
        assert errors == 5
        assert live.breaker.mode == "closed"
        assert not live.candidate(now[0], table.stale_after).stale
        now[0] += table.stale_after + 0.1
        assert live.candidate(now[0], table.stale_after).stale


async def test_controller_stream_feeds_snapshots_and_survives_reconnects() -> None:
    received: list[dict[str, Any]] = []
    revision = ["rev-1"]
    connections: list[web.WebSocketResponse] = []

    async def stream(request: web.Request) -> web.WebSocketResponse:
        assert request.headers.get("Authorization") == "Bearer ctl-token"
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        connections.append(ws)
        await ws.send_str(snap([], revision=revision[0]).model_dump_json())
        async for msg in ws:
            received.append(json.loads(msg.data))
        return ws

    app = web.Application()
    app.router.add_get("/router/v1", stream)
    port = free_port()

    async def start() -> web.AppRunner:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    runner = await start()
    router = Router(RouterOptions())
    link = ControllerLink(
        controller_url(f"127.0.0.1:{port}"),
        "r1",
        "ctl-token",
        router.apply_snapshot,
        lambda: dict(router.last_used),
        use_interval=0.1,
        max_backoff=0.5,
    )
    router.controller = link
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", link=link)
    try:
        await wait_for(lambda: router.table is not None, 30, "the first snapshot")
        router.controller.request_load("sim-kill")
        router.last_used["sim-kill"] = 123.0
        await wait_for(lambda: {"type": "demand", "model": "sim-kill"} in received, 30, "the demand message")
        await wait_for(lambda: {"type": "usage", "models": ["sim-kill"]} in received, 30, "the usage report")
        # The controller goes away: the router keeps the last snapshot. Streams closed first: cleanup waits
        # for open handlers (aiohttp's shutdown timeout) and would hold the test for seconds.
        for ws in connections:
            await ws.close()
        await runner.cleanup()
        assert router.table is not None and router.table.snapshot.revision == "rev-1"
        revision[0] = "rev-2"
        runner = await start()
        await wait_for(
            lambda: router.table is not None and router.table.snapshot.revision == "rev-2",
            30,
            "the snapshot after reconnecting",
        )
    finally:
        await listeners.close()
        await runner.cleanup()


def test_router_process_serves_a_static_snapshot(tmp_path: Path) -> None:
    sim = start_sim("sim-kill", "ek-proc")
    key = "sk-llmgw-" + "e" * 43
    api, met = free_port(), free_port()
    (tmp_path / "keys").write_text(f"# project keys\n{hash_key(key)} p1 key-1\n")
    snapshot = snap([endpoint(sim, "rep-0")]).model_dump(mode="json")
    (tmp_path / "snap.json").write_text(json.dumps(snapshot))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw_router",
            "--snapshot",
            str(tmp_path / "snap.json"),
            "--keys-file",
            str(tmp_path / "keys"),
            "--listen",
            f"127.0.0.1:{api}",
            "--metrics-listen",
            f"127.0.0.1:{met}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    try:
        wait_healthy_sync([sim])
        assert proc.stdout is not None
        seen: list[str] = []
        while (
            not seen or "listening" not in seen[-1]
        ):  # log lines come first; the process says when it serves
            line = proc.stdout.readline().decode()
            assert line, "router exited before listening:\n" + "".join(seen)
            seen.append(line)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{api}/v1", api_key=key, max_retries=0, timeout=60)
        r = c.chat.completions.create(
            model="sim-kill", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert r.usage is not None and r.usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(
                base_url=f"http://127.0.0.1:{api}/v1", api_key="sk-wrong", max_retries=0
            ).models.list()
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        if proc.stdout is not None:
            proc.stdout.close()
        sim.kill()


async def test_a_stale_endpoint_with_free_slots_serves_a_request_waiting_in_line() -> None:
    """Its metrics unknown for longer than stale_after (a broken metrics page), an endpoint is passed over
    on the first walk down the chain, but taken on the second (and by a request in line) while it has slots
    free by the router's own count: unknown is not full. Before, such a request waited out the queue and got
    429."""
    now = [1000.0]
    router = Router(RouterOptions(), clock=lambda: now[0])
    ep = {
        "replica_id": "r-1",
        "model": "sim-kill",
        "engine": "vllm",
        "base_url": "http://127.0.0.1:9",
        "slots": 2,
    }
    router.apply_snapshot(snap([ep]))
    table = router.table
    assert table is not None
    live = table.endpoints["sim-kill"][0]
    now[0] += table.stale_after + 1.0
    assert live.candidate(now[0], table.stale_after).stale
    fwd = router.forwarding
    assert (
        fwd.claim(table, "sim-kill", RequestInfo(), need_room=True) is None
    )  # the first walk passes it over
    picked = await asyncio.wait_for(fwd.pick(table, "sim-kill", ("sim-kill",), RequestInfo()), timeout=5)
    assert picked.endpoint is live and live.inflight == 1
    second = await asyncio.wait_for(fwd.pick(table, "sim-kill", ("sim-kill",), RequestInfo()), timeout=5)
    assert second.endpoint is live and live.inflight == 2
    # Full now by its own count: a third waits in line (and would time out) rather than overfilling it.
    third = asyncio.ensure_future(fwd.pick(table, "sim-kill", ("sim-kill",), RequestInfo()))
    await asyncio.sleep(0)
    assert not third.done()
    fwd.release(live, "sim-kill")
    got = await asyncio.wait_for(third, timeout=5)
    assert got.endpoint is live and live.inflight == 2
