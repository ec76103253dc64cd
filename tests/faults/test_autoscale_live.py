"""Autoscaling on a real fleet: a controller, an agent with sim engines, a router process, the openai client.

A burst on a model at min 1 scales it out (the routers' load reports are the demand), the new replicas serve,
and once the burst is over and the cool-down has passed it scales back in, draining the idlest replicas,
with every request answered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from support import wait_for

from faults.cluster import Cluster
from faults.procs import start_router_following

pytestmark = pytest.mark.integration

KEY = "sk-llmgw-" + "a" * 43

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: sim-auto}
spec:
  context_length: 4096
  scaling: {min: 1, max: 3}
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, args: {max_concurrency: 2, decode_ms_per_token: 25}}
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    # Short cool-downs so the test is short; drain long enough that only "nothing in flight" ends it.
    c = Cluster(tmp_path, scale_up_cooldown_s=1.0, scale_down_cooldown_s=3.0, drain_s=60.0)
    try:
        yield c
    finally:
        await c.close()


class Load:
    """`clients` loops of chat requests; every answer and every failure is counted."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        self.ok = 0
        self.failed: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                r = await self.client.chat.completions.create(
                    model="sim-auto", messages=[{"role": "user", "content": "burst"}], max_tokens=12
                )
                assert r.choices[0].message.content
                self.ok += 1
            except openai.APIError as exc:
                self.failed.append(f"{type(exc).__name__}: {exc}")

    def start(self, clients: int) -> asyncio.Event:
        stop = asyncio.Event()
        self.tasks += [asyncio.create_task(self._loop(stop)) for _ in range(clients)]
        return stop

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def _model(cluster: Cluster) -> dict[str, Any]:
    assert cluster.admin is not None
    status = await cluster.admin.get("/api/v1/status")
    return next(m for m in status["models"] if m["model"] == "sim-auto")


async def test_a_burst_scales_out_serves_and_scales_back_in_without_a_failed_request(
    cluster: Cluster, tmp_path: Path
) -> None:
    await cluster.bring_up(["n1"], {"models/auto.yaml": MODEL})
    await cluster.wait_ready("sim-auto", 1)
    router = start_router_following(tmp_path, [cluster.address], KEY)
    client = openai.AsyncOpenAI(base_url=router.api + "/v1", api_key=KEY, max_retries=0, timeout=60)
    load = Load(client)
    try:
        await wait_for(lambda: _reported(cluster), 30, "the router's first load report")
        # Eight clients on one replica of capacity 2: the queue asks for ceil(8 / 2) = 4, max is 3.
        burst = load.start(8)
        ready = await cluster.wait_ready("sim-auto", 3, "scaled out to max 3 under the burst")
        served_before = load.ok

        async def served_by_all() -> bool:
            return load.ok >= served_before + 30

        await wait_for(served_by_all, 60, "30 more requests answered on three replicas")
        scaled = await _scaled(cluster)
        # Straight to 3 when the first report saw the whole burst, else in steps a cool-down apart.
        assert scaled and scaled[0]["message"].startswith("scaled sim-auto 1->"), scaled
        assert any("->3: queue " in e["message"] for e in scaled), scaled
        assert "capacity 2 per replica (slots)" in scaled[-1]["message"]

        # The burst ends; one client goes on, so the replicas drained on the way down have requests on them.
        burst.set()
        calm = load.start(1)
        kept = await cluster.wait_ready("sim-auto", 1, "scaled back in to 1 after the cool-down")
        assert kept[0]["id"] in {r["id"] for r in ready}
        calm.set()
        await load.close()
        assert load.failed == [], load.failed[:5]
        model = await _model(cluster)
        assert model["autoscale"]["desired"] == 1
        down = (await _scaled(cluster))[-1]
        assert down["message"].startswith("scaled sim-auto 3->1: "), down
        stops = [e for e in await cluster.events() if e["kind"] == "replica_stop"]
        assert sum("scale down to 1" in e["message"] for e in stops) == 2, stops
    finally:
        await load.close()
        await client.close()
        router.stop()
    assert "Traceback" not in router.text()


async def _scaled(cluster: Cluster) -> list[dict[str, Any]]:
    """The model_scaled events, oldest first."""
    events = [e for e in await cluster.events() if e["kind"] == "model_scaled"]
    return sorted(events, key=lambda e: e["time"])


async def _reported(cluster: Cluster) -> bool:
    model = await _model(cluster)
    return bool(model["autoscale"] and model["autoscale"].get("demand"))
