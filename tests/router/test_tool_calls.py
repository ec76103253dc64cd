"""Chat completions tool calls through a real router and a sim engine, driven by the official openai client:
`tool_choice` (auto, none, required, a named function) and `parallel_tool_calls` reach the engine, and the sim
honours them the way a tool loop needs (several calls at once, a forced call after a result, words after a
result otherwise)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from llmgw_router.app import serve
from llmgw_router.path.service import Router, RouterOptions

from llmgw.core.snapshot import RouterSnapshot

from .helpers import SIM_VERIFIED, SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration


def function(name: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {
        "type": "function",
        "function": {"name": name, "description": f"The {name}.", "parameters": params},
    }


TOOLS: Any = [function("get_weather"), function("get_time")]
BOTH: Any = [{"role": "user", "content": "In Paris: use get_weather and get_time."}]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("sim-chat", "engine-key-t")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def client(sim: SimProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    router = Router(RouterOptions())
    model = {"context_length": 4096, "capabilities": ["chat", "tools"], "simulated": True}
    snapshot = {"revision": "r1", "models": {"sim-chat": model}}
    snapshot["endpoints"] = [endpoint(sim, "rep-a", verified=SIM_VERIFIED)]
    router.apply_snapshot(RouterSnapshot.model_validate(snapshot))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    url = f"http://127.0.0.1:{listeners.api_port}/v1"
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-any", max_retries=0, timeout=60) as c:
            yield c
    finally:
        await listeners.close()


async def test_parallel_tool_calls_whole_and_streamed(client: openai.AsyncOpenAI) -> None:
    whole = await client.chat.completions.create(model="sim-chat", messages=BOTH, tools=TOOLS)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert calls == [("get_weather", {"city": "sim"}), ("get_time", {"city": "sim"})]
    async with client.chat.completions.stream(model="sim-chat", messages=BOTH, tools=TOOLS) as stream:
        final = await stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    assert streamed is not None and [c.id for c in streamed] == [c.id for c in choice.message.tool_calls]
    assert [c.function.arguments for c in streamed] == [
        c.function.arguments for c in choice.message.tool_calls
    ]


async def test_parallel_tool_calls_false_gets_one_call(client: openai.AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(
        model="sim-chat", messages=BOTH, tools=TOOLS, parallel_tool_calls=False
    )
    calls = answer.choices[0].message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["get_weather"]


async def test_required_forces_a_call_after_a_result_and_none_forbids_one(client: openai.AsyncOpenAI) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather?"}]
    first = await client.chat.completions.create(
        model="sim-chat", messages=ask, tools=TOOLS, tool_choice="required"
    )
    message = first.choices[0].message
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"}
    turn: Any = [*ask, message.model_dump(exclude_none=True), result]
    forced = await client.chat.completions.create(
        model="sim-chat", messages=turn, tools=TOOLS, tool_choice="required"
    )
    again = forced.choices[0].message.tool_calls
    assert again is not None and [c.function.name for c in again] == ["get_time"]
    free = await client.chat.completions.create(model="sim-chat", messages=turn, tools=TOOLS, max_tokens=3)
    assert free.choices[0].message.tool_calls is None and free.choices[0].message.content
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    chosen = await client.chat.completions.create(
        model="sim-chat", messages=ask, tools=TOOLS, tool_choice=named
    )
    picked = chosen.choices[0].message.tool_calls
    assert picked is not None and [c.function.name for c in picked] == ["get_time"]
    none = await client.chat.completions.create(
        model="sim-chat", messages=BOTH, tools=TOOLS, tool_choice="none", max_tokens=3
    )
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content
