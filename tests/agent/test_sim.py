"""The simulated engine: OpenAI shapes, auth, FIFO queueing beyond its concurrency, prefix cache, vLLM metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from llmgw_agent.sim import SimEngine
from llmgw_agent.sim_model import VOCABULARY, LatencyConfig, PrefixCache, block_hashes, tokenize
from prometheus_client.parser import text_string_to_metric_families
from support import wait_for


async def serve(engine: SimEngine) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(engine.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def sim() -> AsyncIterator[tuple[SimEngine, str]]:
    cfg = LatencyConfig(prefill_ms_per_token=1.0, decode_ms_per_token=20.0, max_concurrency=1, block_size=4)
    engine = SimEngine("sim-model", cfg, api_key="k-test")
    runner, url = await serve(engine)
    yield engine, url
    await runner.cleanup()


def auth() -> dict[str, str]:
    return {"Authorization": "Bearer k-test"}


async def metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_metrics_parse_with_vllm_names(sim: tuple[SimEngine, str]) -> None:
    _, url = sim
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/metrics") as resp:  # open without the key, like vLLM
            text = await resp.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        samples = {s.name for f in families.values() for s in f.samples}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:time_to_first_token_seconds_count",
    ):
        assert name in samples, name
    assert families["vllm:time_to_first_token_seconds"].type == "histogram"
    assert families["vllm:num_requests_running"].type == "gauge"


async def test_key_required_with_openai_error_shape(sim: tuple[SimEngine, str]) -> None:
    _, url = sim
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/models") as resp:
            assert resp.status == 401
            body = await resp.json()
        assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"
        async with http.get(f"{url}/health") as resp:
            assert resp.status == 200
        async with http.get(f"{url}/v1/models", headers=auth()) as resp:
            models = await resp.json()
    assert models["data"][0]["owned_by"] == "llmgw-sim"


async def test_openai_client_chat_completions_embeddings_and_stream(sim: tuple[SimEngine, str]) -> None:
    _, url = sim
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k-test")
    try:
        chat = await client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hello there"}], max_tokens=3
        )
        words = (chat.choices[0].message.content or "").split()
        assert len(words) == 3 and set(words) <= set(VOCABULARY)
        assert chat.usage is not None and chat.usage.completion_tokens == 3
        assert chat.usage.prompt_tokens == len(tokenize("user: hello there"))

        comp = await client.completions.create(model="sim-model", prompt="a b c", max_tokens=2)
        assert (
            comp.usage is not None
            and comp.usage.prompt_tokens == 3
            and len(comp.choices[0].text.split()) == 2
        )

        emb = await client.embeddings.create(model="sim-model", input=["x y", "z"])
        assert len(emb.data) == 2 and emb.usage.prompt_tokens == 3

        stream = await client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces: list[str] = []
        usage: Any = None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if chunk.usage is not None:
                usage = chunk.usage
        assert len("".join(pieces).split()) == 4
        assert usage is not None and usage.completion_tokens == 4
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    finally:
        await client.close()


async def test_queues_beyond_concurrency_in_arrival_order(sim: tuple[SimEngine, str]) -> None:
    engine, url = sim  # max_concurrency=1
    finished: list[str] = []

    async def call(http: aiohttp.ClientSession, name: str) -> dict[str, Any]:
        # 50 tokens at 20 ms: a second per request, so `a` still runs while b and c queue and the metrics are
        # read, even on a machine busy enough to stall this loop for a few hundred milliseconds.
        body = {"model": "sim-model", "prompt": f"request {name}", "max_tokens": 50, "ignore_eos": True}
        async with http.post(f"{url}/v1/completions", json=body, headers=auth()) as resp:
            data: dict[str, Any] = await resp.json()
        finished.append(name)
        return data

    async with aiohttp.ClientSession() as http:
        first = asyncio.create_task(call(http, "a"))
        await wait_for(lambda: engine.stats.running == 1, limit_s=20, what="a running")
        second = asyncio.create_task(call(http, "b"))
        await wait_for(lambda: engine.slots.waiting == 1, limit_s=20, what="b waiting")
        third = asyncio.create_task(call(http, "c"))
        await wait_for(lambda: engine.slots.waiting == 2, limit_s=20, what="c waiting")
        seen = await metrics(http, url)
        assert seen["vllm:num_requests_running"] == 1
        assert seen["vllm:num_requests_waiting"] == 2
        await asyncio.gather(first, second, third)
        after = await metrics(http, url)
    assert finished == ["a", "b", "c"]
    assert after["vllm:num_requests_waiting"] == 0 and after["vllm:num_requests_running"] == 0
    assert after["vllm:generation_tokens_total"] == 150


async def test_repeated_prefix_pays_less_prefill(sim: tuple[SimEngine, str]) -> None:
    _, url = sim  # block_size=4, 1 ms per prompt token
    history = [{"role": "user", "content": " ".join(f"w{i}" for i in range(30))}]
    async with aiohttp.ClientSession() as http:

        async def chat(messages: list[dict[str, str]]) -> dict[str, Any]:
            body = {"model": "sim-model", "messages": messages, "max_tokens": 2}
            headers = {**auth(), "X-Llmgw-Sim-Info": "1"}  # the timing breakdown, asked for
            async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.headers["x-llmgw-sim-cached-tokens"] is not None
                data: dict[str, Any] = await resp.json()
                return data

        cold = await chat(history)
        warm = await chat(history)
        grown = await chat(
            [*history, {"role": "assistant", "content": "alpha beta"}, {"role": "user", "content": "more"}]
        )
        after = await metrics(http, url)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cold["llmgw_sim"]["prefill_ms"] == cold["usage"]["prompt_tokens"] * 1.0
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert warm["llmgw_sim"]["prefill_ms"] < cold["llmgw_sim"]["prefill_ms"]
    # The grown conversation reuses the first turn's cached blocks and pays only for what is new.
    assert (
        grown["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert grown["llmgw_sim"]["prefill_ms"] < grown["usage"]["prompt_tokens"] * 1.0
    assert after["vllm:prefix_cache_hits_total"] > 0


def test_prefix_cache_is_lru_bounded_and_longest_prefix() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=3)
    a = ["a", "b", "c", "d", "e", "f"]
    cache.insert(a)
    assert cache.lookup(a) == 6
    assert cache.lookup(["a", "b", "c", "d", "x", "y"]) == 4  # longest cached prefix, block-aligned
    cache.insert(["q", "r", "s", "t"])  # two new blocks push out the least recently used
    assert cache.lookup(a) < 6
    assert len(block_hashes(["a", "b", "c"], 2)) == 1  # a partial block is never cached


def _tool(name: str, **params: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": params, "required": list(params)}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def test_tool_call_is_deterministic_and_follows_tool_choice() -> None:
    from llmgw_agent.sim_model import tool_calls

    tools = [
        _tool("a", city={"type": "string"}),
        _tool("b", n={"type": "integer"}, unit={"enum": ["c", "f"]}),
    ]
    asked = [{"role": "user", "content": "go"}]
    (first,) = tool_calls({"tools": tools, "messages": asked})
    assert first[1:] == ("a", '{"city": "sim"}')
    assert tool_calls({"tools": tools, "messages": asked}) == [first]  # the same request, the same call
    named = {"type": "function", "function": {"name": "b"}}
    assert [c[1:] for c in tool_calls({"tools": tools, "messages": asked, "tool_choice": named})] == [
        ("b", '{"n": 1, "unit": "c"}')
    ]
    assert tool_calls({"tools": tools, "messages": asked, "tool_choice": "none"}) == []
    answered = [*asked, {"role": "tool", "tool_call_id": first[0], "content": "ok"}]
    assert tool_calls({"tools": tools, "messages": answered}) == []  # a tool's result is answered in words
    assert tool_calls({"messages": asked}) == []


def _named(calls: list[tuple[str, str, str]]) -> list[str]:
    return [name for _, name, _ in calls]


def test_tools_named_in_the_users_text_are_called_in_parallel_unless_that_is_off() -> None:
    from llmgw_agent.sim_model import tool_calls

    tools = [_tool("get_weather", city={"type": "string"}), _tool("get_time"), _tool("get")]
    asked = [{"role": "user", "content": [{"type": "text", "text": "use get_time and get_weather"}]}]
    calls = tool_calls({"tools": tools, "messages": asked})
    assert _named(calls) == ["get_weather", "get_time"]  # in the order offered; `get` is no word there
    assert len({c[0] for c in calls}) == 2  # each call its own id
    serial = tool_calls({"tools": tools, "messages": asked, "parallel_tool_calls": False})
    assert _named(serial) == ["get_weather"]


def test_required_calls_the_next_uncalled_tool_after_a_result_and_named_always_calls() -> None:
    from llmgw_agent.sim_model import tool_calls

    tools = [_tool("lookup"), _tool("final_result", answer={"type": "string"})]
    asked = [{"role": "user", "content": "what is it?"}]
    body: dict[str, Any] = {"tools": tools, "tool_choice": "required", "messages": asked}
    (first,) = tool_calls(body)
    assert first[1] == "lookup"
    call = {"id": first[0], "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    body["messages"] = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": first[0], "content": "ok"},
    ]
    assert _named(tool_calls(body)) == ["final_result"]  # required: a call, of the tool not called yet
    assert tool_calls({**body, "tool_choice": "auto"}) == []  # auto: the result is answered in words
    named = {"type": "function", "function": {"name": "lookup"}}
    assert _named(tool_calls({**body, "tool_choice": named})) == ["lookup"]  # forced, every turn


async def test_openai_client_gets_a_tool_call_whole_and_streamed(sim: tuple[SimEngine, str]) -> None:
    _, url = sim
    tools: Any = [_tool("get_weather", city={"type": "string"})]
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k-test", max_retries=0) as c:
        whole = await c.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "weather?"}], tools=tools
        )
        stream = await c.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "weather?"}], tools=tools, stream=True
        )
        chunks = [ch async for ch in stream]
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and call.function.arguments == '{"city": "sim"}'  # type: ignore[union-attr]
    deltas = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id == call.id and deltas[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"input": {"type": "string"}}},
    },
}


async def test_offered_tools_are_called_until_a_result_comes_back(sim: tuple[SimEngine, str]) -> None:
    _, url = sim
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k-test", max_retries=0) as c:
        ask = [{"role": "user", "content": "look it up"}]
        first = await c.chat.completions.create(model="sim-model", messages=ask, tools=[TOOL], max_tokens=2)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.function.name == "lookup" and set(json.loads(call.function.arguments)) == {"input"}
        pieces = []
        stream = await c.chat.completions.create(
            model="sim-model",
            messages=ask,
            tools=[TOOL],
            max_tokens=2,
            stream=True,
        )
        async for chunk in stream:
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                pieces.append(tc.function.arguments if tc.function else "")
        assert "".join(p or "" for p in pieces) == call.function.arguments  # the same call, streamed
        result = [*ask, choice.message.model_dump(exclude_none=True)]
        result.append({"role": "tool", "tool_call_id": call.id, "content": "found"})
        after = await c.chat.completions.create(
            model="sim-model", messages=result, tools=[TOOL], max_tokens=2
        )
        assert after.choices[0].message.content and not after.choices[0].message.tool_calls
        none = await c.chat.completions.create(
            model="sim-model",
            messages=ask,
            tools=[TOOL],
            tool_choice="none",
            max_tokens=2,
        )
        assert none.choices[0].message.content and none.choices[0].finish_reason == "length"


async def test_a_response_format_is_answered_with_json_whole_and_streamed(sim: tuple[SimEngine, str]) -> None:
    """Structured output (the Agents SDK's output_type): the schema's sample value, streamed in pieces that
    join to what the whole answer gives."""
    _, url = sim
    ask: Any = [{"role": "user", "content": "weather?"}]
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}}}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k-test", max_retries=0) as c:
        whole = await c.chat.completions.create(model="sim-model", messages=ask, response_format=fmt)
        stream = await c.chat.completions.create(
            model="sim-model", messages=ask, response_format=fmt, stream=True
        )
        pieces = [
            ch.choices[0].delta.content async for ch in stream if ch.choices and ch.choices[0].delta.content
        ]
    assert json.loads(whole.choices[0].message.content or "") == {"city": "sim", "degrees": 1}
    assert "".join(pieces) == whole.choices[0].message.content and len(pieces) > 1


async def test_rerank_and_score_by_word_overlap(sim: tuple[SimEngine, str]) -> None:
    _, url = sim
    docs = ["red apple", "green pear", "apple pie recipe"]
    async with aiohttp.ClientSession(headers=auth()) as http:
        body = {"model": "sim-model", "query": "apple", "documents": docs}
        async with http.post(f"{url}/v1/rerank", json=body) as resp:
            ranked = await resp.json()
        body = {"model": "sim-model", "text_1": ["apple", "pear"], "text_2": ["red apple", "red apple"]}
        async with http.post(f"{url}/v1/score", json=body) as resp:
            scored = await resp.json()
        async with http.post(
            f"{url}/v1/score", json={"model": "sim-model", "text_1": ["a", "b"], "text_2": ["c"] * 3}
        ) as resp:
            assert resp.status == 400
    assert [(r["index"], r["relevance_score"]) for r in ranked["results"]] == [
        (0, 0.5),
        (2, 0.333333),
        (1, 0.0),
    ]
    assert [d["score"] for d in scored["data"]] == [0.5, 0.0]
