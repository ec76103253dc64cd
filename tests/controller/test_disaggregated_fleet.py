"""Prefill and decode apart (issue 46), through a real controller, agent, sim engines and router: a disaggregated
model's request is served in two steps with one usage row, the decode carries the prefill's
`kv_transfer_params` (the decode sim could only take the prompt's KV with them), a decode replica killed while
the request is in its prefill step falls back to the model's plain replica as `on_failure: plain` says, and
the prefill and decode pools are scaled each by its own replica count. A decode replica killed once the client
has the first words of its stream is continued, in the same stream, on the model's plain replica."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from faults.cluster import Cluster
from faults.procs import RouterProc, start_router_proc
from support import wait_for

from controller.fleet_ops import bring_up, routed
from llmgw.adapters import keys
from llmgw.store.records import UsageRecord

pytestmark = pytest.mark.integration

FRONT = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: m}
spec:
  context_length: 8192
  disaggregation: {prefill: m-prefill, decode: m-decode, on_failure: plain}
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, args: {decode_ms_per_token: 1}}
"""


def pool(role: str, replicas: int, decode_ms: int = 1) -> str:
    # The prefill pool's prompt costs 2 ms a token: a long prompt holds the prefill step long enough to act on.
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: m-{role}}}
spec:
  context_length: 8192
  scaling: {{min: {replicas}, max: {replicas}}}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1, role: {role}, args: {{decode_ms_per_token: {decode_ms}, prefill_ms_per_token: 2}}}}
"""


async def _router(tmp: Path, cluster: Cluster) -> tuple[RouterProc, openai.AsyncOpenAI]:
    """A router following the controller, its keys and usage rows in the controller's store; a client."""
    assert cluster.running is not None
    key = (await keys.create_key(cluster.running.controller.store, "web", time.time())).plaintext
    args = [
        "--controller",
        cluster.address,
        "--token-file",
        str(tmp / "token"),
        "--store",
        cluster.settings.store,
    ]
    router = await asyncio.to_thread(start_router_proc, tmp / "router.log", args)
    return router, openai.AsyncOpenAI(base_url=router.api + "/v1", api_key=key, max_retries=0, timeout=30)


async def _engine_keys(cluster: Cluster, count: int) -> dict[str, str]:
    """Replica id -> its engine's key, from the snapshot routers are sent (once it holds `count` endpoints)."""
    assert cluster.running is not None
    headers = {"Authorization": f"Bearer {cluster.running.admin_token}"}
    url = cluster.running.url + "/router/v1"
    async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=headers) as ws:
        while True:
            msg = await ws.receive(timeout=30)
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            endpoints = json.loads(msg.data)["endpoints"]
            if len(endpoints) == count:
                return {e["replica_id"]: e["api_key"] for e in endpoints}


async def _sim_metrics(replica: dict[str, Any], keys: dict[str, str]) -> dict[str, float]:
    """The sim's /metrics as {name{labels}: value}, read from the replica's engine (through its node's agent)."""
    headers = {"Authorization": f"Bearer {keys[replica['id']]}"}
    async with aiohttp.ClientSession() as s, s.get(replica["base_url"] + "/metrics", headers=headers) as r:
        assert r.status == 200, await r.text()
        text = await r.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def _transfers(metrics: dict[str, float], direction: str) -> float:
    return sum(
        v for k, v in metrics.items() if k.startswith("llmgw_sim_kv_transfers_total") and direction in k
    )


async def _rows(cluster: Cluster, count: int) -> list[UsageRecord]:
    assert cluster.running is not None
    store = cluster.running.controller.store

    async def arrived() -> list[UsageRecord] | None:
        rows = await store.usage_page(0, time.time() + 60, model="m")
        return rows if len(rows) >= count else None

    found: list[UsageRecord] = await wait_for(arrived, 30, f"{count} usage rows for m")
    return found


async def test_a_disaggregated_model_is_served_in_two_steps(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    router = None
    models = {"models/m.yaml": FRONT, "models/p.yaml": pool("prefill", 1), "models/d.yaml": pool("decode", 2)}
    try:
        await bring_up(cluster, ["n1"], models)
        [prefill] = await cluster.wait_ready("m-prefill", 1)
        decodes = await cluster.wait_ready("m-decode", 2, "two decode replicas beside one prefill replica")
        [plain] = await cluster.wait_ready("m", 1)
        assert cluster.admin is not None
        pools = (await cluster.admin.get("/api/v1/explain/m"))["pools"]  # `llmgw explain m` shows both pools
        assert {r: (p["model"], p["health"]["ready"]) for r, p in pools.items()} == {
            "prefill": ("m-prefill", 1),
            "decode": ("m-decode", 2),
        }
        router, client = await _router(tmp_path, cluster)
        await routed(client, "m-decode")  # the router has the pools' endpoints
        keys = await _engine_keys(cluster, 4)
        before = [_transfers(await _sim_metrics(d, keys), "received") for d in decodes]
        sent_before = _transfers(await _sim_metrics(prefill, keys), "sent")

        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "tell me about the prefill and the decode"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = next(c.usage for c in chunks if c.usage is not None)
        assert text and usage.completion_tokens == 5

        # The prefill sim handed the KV over once; one decode sim took it, which it can only do with the
        # kv_transfer_params the prefill's answer carried (its engine id and block ids).
        assert _transfers(await _sim_metrics(prefill, keys), "sent") == sent_before + 1
        after = [_transfers(await _sim_metrics(d, keys), "received") for d in decodes]
        assert sum(after) - sum(before) == 1
        took = decodes[[a - b for a, b in zip(after, before, strict=True)].index(1)]

        [row] = await _rows(cluster, 1)  # one row for the two steps
        assert (row.model, row.status, row.endpoint) == ("m", 200, took["id"])
        assert row.tokens_out == 5 and row.tokens_in == usage.prompt_tokens  # the prompt counted once

        # Each pool is scaled by its own count: two prefill replicas, one decode replica.
        cluster.repo.write(
            {"models/p.yaml": pool("prefill", 2), "models/d.yaml": pool("decode", 1)}, "rescale"
        )
        await cluster.wait_ready("m-prefill", 2, "the prefill pool grown to two")
        [decode] = await cluster.wait_ready("m-decode", 1, "the decode pool shrunk to one")
        keys = await _engine_keys(cluster, 4)
        assert [r["id"] for r in await cluster.wait_ready("m", 1)] == [plain["id"]]  # the plain one untouched

        # The decode replica dies while the request is in its prefill step: served whole by m's own replica.
        prompt = " ".join(f"w{i}" for i in range(1500))  # 1500 tokens at 2 ms: about 3 s of prefill
        asked = asyncio.create_task(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": prompt}], max_tokens=3, stream=True
            )
        )

        async def prefilling() -> bool:
            for replica in await cluster.wait_ready("m-prefill", 2):
                running = await _sim_metrics(replica, keys)
                if any(k.startswith("vllm:num_requests_running") and v >= 1 for k, v in running.items()):
                    return True
            return False

        await wait_for(prefilling, 30, "the prefill step running")
        os.kill(int(decode["pid"]), signal.SIGKILL)
        answer = await asked
        words = "".join([c.choices[0].delta.content or "" async for c in answer if c.choices])
        assert words
        rows = await _rows(cluster, 2)
        last = max(rows, key=lambda r: r.time)
        assert (last.model, last.status, last.endpoint) == ("m", 200, plain["id"])
        assert last.attempts and last.attempts[0]["reason"].startswith("decode:"), last.attempts
        async with aiohttp.ClientSession() as s, s.get(router.metrics + "/metrics") as r:
            page = await r.text()
        assert 'llmgw_router_disaggregated_fallbacks_total{model="m",policy="plain"} 1.0' in page
        assert (
            'llmgw_router_disaggregated_steps_total{model="m-decode",outcome="ok",role="decode"} 1.0' in page
        )
        await client.close()
    finally:
        if router is not None:
            router.stop()
        await cluster.close()
        cluster.agents.cleanup()


async def test_a_decode_killed_mid_stream_is_continued_on_a_plain_replica(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    router = None
    # The decode sim takes 150 ms a word: the client has its first word long before the twelfth is due.
    models = {
        "models/m.yaml": FRONT,
        "models/p.yaml": pool("prefill", 1),
        "models/d.yaml": pool("decode", 1, 150),
    }
    try:
        await bring_up(cluster, ["n1"], models)
        await cluster.wait_ready("m-prefill", 1)
        [decode] = await cluster.wait_ready("m-decode", 1)
        [plain] = await cluster.wait_ready("m", 1)
        router, client = await _router(tmp_path, cluster)
        await routed(client, "m-decode")
        prompt = "tell me a long story"
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = []
        killed = False
        async for chunk in stream:  # the decode is killed as soon as the client has its first word
            chunks.append(chunk)
            if not killed and any(c.delta.content for c in chunk.choices):
                os.kill(int(decode["pid"]), signal.SIGKILL)
                killed = True
        words = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split()
        usage = chunks[-1].usage
        # One coherent stream: one id, one opening, twelve words (the cap), the usage counting both decodes.
        assert {c.id for c in chunks} == {chunks[0].id}
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
        assert usage is not None and usage.completion_tokens == 12 and len(words) == 12

        [row] = await _rows(cluster, 1)
        assert (row.model, row.status, row.endpoint) == ("m", 200, plain["id"])
        assert row.attempts is not None and row.attempts[-1]["endpoint"] == decode["id"], row.attempts
        broke = row.attempts[-1]["reason"]
        assert broke.startswith("decode: the stream broke after "), broke
        given = int(broke.split()[-2])
        assert 1 <= given < 12
        # The plain sim read the prompt and the words streamed before the kill as its answer's start (it
        # refuses vLLM's continue flags without a final assistant message): its prompt is both, as the sim
        # counts words, "role: content" a message.
        asked = len(f"user: {prompt}".split()) + len(("assistant: " + " ".join(words[:given])).split())
        assert usage.prompt_tokens == asked and (row.tokens_in, row.tokens_out) == (asked, 12)
        async with aiohttp.ClientSession() as s, s.get(router.metrics + "/metrics") as r:
            page = await r.text()
        assert 'llmgw_router_disaggregated_fallbacks_total{model="m",policy="plain"} 1.0' in page
        assert 'disaggregated_steps_total{model="m",outcome="ok",role="continue"} 1.0' in page
        await client.close()
    finally:
        if router is not None:
            router.stop()
        await cluster.close()
        cluster.agents.cleanup()
