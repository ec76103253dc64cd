"""A disaggregated model's two steps through a real router process, against engine stand-ins that check the
protocol (issue 46): the prefill is asked for one token, whole, with the KV kept for a remote decode (the
client's own `kv_transfer_params` never reaches it); a decode replica answering 503 is, under `on_failure:
retry`, followed by both steps once more on other replicas; and the decode that serves carries exactly the
`kv_transfer_params` its own prefill returned."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from faults.procs import FakeEngine, start_router_proc
from support import wait_for

pytestmark = pytest.mark.integration

METRICS = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"


def _prefill(name: str, seen: list[dict[str, Any]]) -> FakeEngine:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": name,
            "remote_block_ids": [len(seen)],
            "remote_host": "127.0.0.1",
            "remote_port": 1,
        }
        answer = {"id": "x", "object": "chat.completion", "choices": [], "kv_transfer_params": params}
        return web.json_response(answer)

    return FakeEngine(behave={"/v1/chat/completions": chat, "/metrics": _metrics}).start()


def _decode(seen: list[dict[str, Any]], status: int) -> FakeEngine:
    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.json())
        if status != 200:
            return web.json_response({"error": {"message": "decode refused"}}, status=status)
        message = {"role": "assistant", "content": "alpha beta"}
        usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
        answer = {
            "id": "y",
            "object": "chat.completion",
            "model": "md",
            "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
        return web.json_response(answer)

    return FakeEngine(behave={"/v1/chat/completions": chat, "/metrics": _metrics}).start()


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(text=METRICS)


def _snapshot(engines: dict[str, tuple[str, FakeEngine]]) -> dict[str, Any]:
    model = {"context_length": 4096, "capabilities": ["chat"], "routing_policy": "rr"}
    pd = {"prefill": "mp", "decode": "md", "on_failure": "retry"}
    return {
        "revision": "pd-1",
        "router": {"scrape_interval": "200ms"},
        "models": {"m": model | {"disaggregation": pd}, "mp": model, "md": model},
        "policies": {"rr": {"picker": "round_robin"}},
        "endpoints": [
            {
                "replica_id": rid,
                "model": m,
                "engine": "vllm",
                "base_url": e.base_url,
                "api_key": "k",
                "slots": 4,
            }
            for rid, (m, e) in engines.items()
        ],
    }


async def test_a_refused_decode_is_retried_with_both_steps_elsewhere(tmp_path: Path) -> None:
    prefills: list[dict[str, Any]] = []
    decodes: list[dict[str, Any]] = []
    engines = {
        "p1": ("mp", _prefill("p1", prefills)),
        "p2": ("mp", _prefill("p2", prefills)),
        "d1": ("md", _decode(decodes, 503)),
        "d2": ("md", _decode(decodes, 200)),
    }
    router = None
    try:
        (tmp_path / "snapshot.json").write_text(json.dumps(_snapshot(engines)))
        args = ["--snapshot", str(tmp_path / "snapshot.json"), "--no-auth"]
        router = await asyncio.to_thread(start_router_proc, tmp_path / "router.log", args)

        async def ready() -> bool:
            async with aiohttp.ClientSession() as s, s.get(router.metrics + "/metrics") as r:
                page = await r.text()
            return all(f'endpoint="{rid}"' in page and 'state="ready"' in page for rid in engines)

        await wait_for(ready, 30, "the four endpoints scraped")
        client = openai.AsyncOpenAI(base_url=router.api + "/v1", api_key="none", max_retries=0)
        answer = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=20,
            extra_body={"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.9.9.9"}},
        )
        await client.close()
        assert answer.choices[0].message.content == "alpha beta" and answer.usage is not None
        assert answer.usage.completion_tokens == 2

        # Both prefills (the first, and the retry's on the other replica) were asked the same: one token,
        # whole, the KV kept; the client's own parameters replaced by the router's.
        assert len(prefills) == 2 and {p["kv_transfer_params"]["do_remote_decode"] for p in prefills} == {
            True
        }
        assert all(p["max_tokens"] == 1 and p["stream"] is False for p in prefills)
        assert all(p["kv_transfer_params"]["remote_host"] is None for p in prefills)
        # The refused decode, then the one that served, each with what its own prefill returned.
        assert [d["kv_transfer_params"]["remote_block_ids"] for d in decodes] == [[1], [2]]
        engine_ids = {d["kv_transfer_params"]["remote_engine_id"] for d in decodes}
        assert engine_ids == {"p1", "p2"}, "the retry's prefill ran on the other replica"
        assert decodes[1]["max_tokens"] == 20
    finally:
        if router is not None:
            router.stop()
        for _, engine in engines.values():
            engine.stop()
