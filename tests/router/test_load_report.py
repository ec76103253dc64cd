"""The router's load report (llmgw_router.fleet.load): what it counts as real requests go through a router in front
of a sim engine, and the link sending it to a controller stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from llmgw_router.fleet.link import ControllerLink
from support import serving, wait_for

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync
from .test_integration import KEY_P1, snapshot, start_router

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slow_sims() -> Iterator[list[SimProcess]]:
    procs = [start_sim("sim-chat", "engine-key-a", decode_ms=30), start_sim("sim-chat", "engine-key-b")]
    try:
        wait_healthy_sync(procs)
        yield procs
    finally:
        for p in procs:
            p.kill()


async def test_queue_inflight_ttft_refusals_and_replicas_are_reported(slow_sims: list[SimProcess]) -> None:
    snap = snapshot(
        slow_sims,
        router={"max_body_bytes": 100_000, "admission": {"queue_size": 2, "timeout": "30s"}},
        endpoints=[endpoint(slow_sims[0], "rep-a", slots=1)],
    )
    router, listeners, _ = await start_router(snap)
    url = f"http://127.0.0.1:{listeners.api_port}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {KEY_P1}"}
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 40}
    try:
        first = router.load_report()
        assert first["models"]["sim-chat"] == {"queued": 0, "inflight": 0, "ttft_p99_ms": None, "refused": 0}
        engine = first["replicas"]["rep-a"].pop("engine")  # the router's last scrape, if it made one yet
        assert set(engine) == {"running", "waiting", "kv_usage", "scrape_error"}
        assert first["replicas"] == {
            "rep-a": {
                "inflight": 0,
                "last_request_at": None,
                "routed": True,
                "requests": 0,
                "errors": 0,
                "ttft_p99_ms": None,
            }
        }
        async with aiohttp.ClientSession() as s:
            calls = [asyncio.create_task(s.post(url, json=body, headers=headers)) for _ in range(3)]

            def busy() -> dict[str, Any] | None:
                report = router.load_report()
                m = report["models"]["sim-chat"]
                return report if (m["queued"], m["inflight"]) == (2, 1) else None

            report = await wait_for(busy, 30, "one request in flight on the one slot and two queued")
            assert report["replicas"]["rep-a"]["inflight"] == 1
            assert report["replicas"]["rep-a"]["last_request_at"] is not None
            async with s.post(url, json=dict(body, max_tokens=1), headers=headers) as r:
                assert r.status == 429  # the queue holds two
            for call in calls:
                resp = await call
                assert resp.status == 200
                await resp.read()

        def settled() -> bool:
            # A request is accounted just after its answer is sent: wait for all four before reading.
            sample = router.metrics.registry.get_sample_value
            ok = {"model": "sim-chat", "status": "200", "code": ""}
            refused = {"model": "sim-chat", "status": "429", "code": "queue_full"}
            return (
                sample("llmgw_router_requests_total", ok) == 3
                and sample("llmgw_router_requests_total", refused) == 1
            )

        await wait_for(settled, 30, "the four requests accounted")
        after = router.load_report()["models"]["sim-chat"]
        assert after["refused"] == 1 and after["queued"] == 0 and after["inflight"] == 0
        assert after["ttft_p99_ms"] is not None and after["ttft_p99_ms"] > 0
        assert router.load_report()["models"]["sim-chat"]["refused"] == 0  # counted once, since the last
        # Per replica, what a canary's gates compare: every attempt, its errors, its TTFT.
        rep = router.load_report()["replicas"]["rep-a"]
        assert (rep["requests"], rep["errors"]) == (3, 0)
        assert rep["ttft_p99_ms"] is not None and rep["ttft_p99_ms"] > 0
        # And the engine's own metrics as the router last scraped them, for the console's replica page.
        scraped = await wait_for(
            lambda: (e := router.load_report()["replicas"]["rep-a"]["engine"])["running"] is not None and e,
            30,
            "a scrape of the sim's metrics",
        )
        assert scraped["running"] >= 0 and scraped["waiting"] >= 0 and scraped["scrape_error"] is None
        assert scraped["kv_usage"] is not None and 0 <= scraped["kv_usage"] <= 1
    finally:
        await listeners.close()


async def test_a_dropped_replica_is_listed_until_its_last_request_ends(slow_sims: list[SimProcess]) -> None:
    snap = snapshot(slow_sims, endpoints=[endpoint(slow_sims[0], "rep-a"), endpoint(slow_sims[1], "rep-b")])
    router, listeners, _ = await start_router(snap)
    url = f"http://127.0.0.1:{listeners.api_port}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {KEY_P1}"}
    # ignore_eos: the sim would end the answer by itself after a few words (tens of ms on the fast sim); all
    # 200 tokens keep it in flight while the snapshot drops its replica.
    body = {
        "model": "sim-chat",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 200,
        "ignore_eos": True,
    }
    try:
        async with aiohttp.ClientSession() as s:
            call = asyncio.create_task(s.post(url, json=body, headers=headers))
            busy = await wait_for(
                lambda: next((r for r, v in router.load_report()["replicas"].items() if v["inflight"]), None),
                30,
                "a request in flight",
            )
            other = "rep-b" if busy == "rep-a" else "rep-a"
            keep = slow_sims[1] if other == "rep-b" else slow_sims[0]
            router.apply_snapshot(snapshot(slow_sims, endpoints=[endpoint(keep, other)]))
            dropped = router.load_report()["replicas"][busy]
            assert dropped["routed"] is False and dropped["inflight"] == 1
            resp = await call
            assert resp.status == 200
            await resp.read()
        assert busy not in router.load_report()["replicas"]
    finally:
        await listeners.close()


async def test_the_link_sends_load_reports_on_its_interval() -> None:
    got: list[dict[str, Any]] = []

    async def stream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            got.append(json.loads(msg.data))
        return ws

    app = web.Application()
    app.router.add_get("/router/v1", stream)
    async with serving(app) as port:
        report = {
            "type": "load",
            "models": {"m": {"queued": 3, "inflight": 1, "ttft_p99_ms": None, "refused": 0}},
            "replicas": {},
        }
        link = ControllerLink(
            f"ws://127.0.0.1:{port}/router/v1",
            "r1",
            None,
            lambda _s: None,
            dict,
            load=lambda: report,
            load_interval=0.05,
        )
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(link.run(session))
            try:
                await wait_for(
                    lambda: sum(1 for m in got if m.get("type") == "load") >= 3, 10, "three load reports"
                )
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert next(m for m in got if m["type"] == "load") == report
