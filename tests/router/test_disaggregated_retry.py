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
from faults.procs import FakeEngine, RouterProc, start_router_proc
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


# ---- a decode that breaks after the client has bytes (the continuation: path/disaggregated/midstream.py)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(rid: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion.chunk", "created": 7, "model": "md", "choices": [choice]}


def _streaming(seen: list[tuple[str, dict[str, Any]]], name: str, calls: list[int]) -> FakeEngine:
    """A decode replica whose first stream (of all such replicas': `calls` is shared) breaks after three words,
    the engine's connection dropped; any later one streams four words to its end, with its usage."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append((name, body))
        calls.append(1)
        breaks = len(calls) == 1
        rid = "chatcmpl-first" if breaks else "chatcmpl-second"
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        await answer.write(_event(_chunk(rid, {"role": "assistant", "content": ""})))
        words = ["one", " two", " three"] if breaks else [" four", " five", " six", " seven"]
        for word in words:
            await answer.write(_event(_chunk(rid, {"content": word})))
        if breaks:
            assert request.transport is not None
            request.transport.abort()  # the engine is gone mid-stream
            return answer
        await answer.write(_event(_chunk(rid, {}, "stop")))
        usage = {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
        await answer.write(_event({**_chunk(rid, {}), "choices": [], "usage": usage}))
        await answer.write(b"data: [DONE]\n\n")
        return answer

    return FakeEngine(behave={"/v1/chat/completions": chat, "/metrics": _metrics}).start()


async def _router_for(tmp: Path, engines: dict[str, tuple[str, FakeEngine]], policy: str) -> RouterProc:
    snapshot = _snapshot(engines)
    snapshot["models"]["m"]["disaggregation"]["on_failure"] = policy
    (tmp / "snapshot.json").write_text(json.dumps(snapshot))
    args = ["--snapshot", str(tmp / "snapshot.json"), "--no-auth"]
    router = await asyncio.to_thread(start_router_proc, tmp / "router.log", args)

    async def ready() -> bool:
        async with aiohttp.ClientSession() as s, s.get(router.metrics + "/metrics") as r:
            page = await r.text()
        return all(f'endpoint="{rid}"' in page and 'state="ready"' in page for rid in engines)

    await wait_for(ready, 30, "the endpoints scraped")
    return router


async def _events(router: RouterProc) -> list[Any]:
    """The client's stream, each data event parsed ([DONE] as the string)."""
    ask = {
        "model": "m",
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as s, s.post(router.api + "/v1/chat/completions", json=ask) as r:
        assert r.status == 200, await r.text()
        text = await r.text()
    datas = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in datas]


async def test_a_decode_broken_mid_stream_is_continued_on_another_decode_replica(tmp_path: Path) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    calls: list[int] = []
    engines = {
        "p1": ("mp", _prefill("p1", [])),
        "d1": ("md", _streaming(seen, "d1", calls)),
        "d2": ("md", _streaming(seen, "d2", calls)),
    }
    router = None
    try:
        router = await _router_for(tmp_path, engines, "retry")
        events = await _events(router)
        # One stream: one id, one opening, the three words the broken decode gave and the four of the other,
        # its end and [DONE]; the usage counts the continuation's prompt and both decodes' words.
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert {c["id"] for c in chunks} == {"chatcmpl-first"} and {c["created"] for c in chunks} == {7}
        openings = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
        assert len(openings) == 1
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == "one two three four five six seven"
        assert chunks[-1]["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}

        # The continuation went to the other decode replica: the request with the words streamed as the start
        # of the answer, vLLM's continue flags, the cap what is left of it, and no KV to take.
        (broke, first), (went, second) = seen
        assert {broke, went} == {"d1", "d2"} and "kv_transfer_params" in first
        assert second["messages"] == [
            {"role": "user", "content": "count"},
            {"role": "assistant", "content": "one two three"},
        ]
        assert second["continue_final_message"] is True and second["add_generation_prompt"] is False
        assert second["max_tokens"] == 17 and second["stream"] is True
        assert "kv_transfer_params" not in second
        async with aiohttp.ClientSession() as s, s.get(router.metrics + "/metrics") as r:
            page = await r.text()
        assert 'llmgw_router_disaggregated_fallbacks_total{model="m",policy="retry"} 1.0' in page
        assert 'disaggregated_steps_total{model="md",outcome="ok",role="continue"} 1.0' in page
    finally:
        if router is not None:
            router.stop()
        for _, engine in engines.values():
            engine.stop()


async def test_a_decode_broken_mid_stream_under_fail_ends_with_an_error_event(tmp_path: Path) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    engines = {"p1": ("mp", _prefill("p1", [])), "d1": ("md", _streaming(seen, "d1", []))}
    router = None
    try:
        router = await _router_for(tmp_path, engines, "fail")
        events = await _events(router)
        assert events[-1] == "[DONE]" and len(seen) == 1  # nothing continued it
        error = events[-2]["error"]
        assert error["code"] == "upstream_unavailable" and "on_failure is fail" in error["message"], error
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events[:-2] if c["choices"])
        assert text == "one two three"
    finally:
        if router is not None:
            router.stop()
        for _, engine in engines.values():
            engine.stop()
