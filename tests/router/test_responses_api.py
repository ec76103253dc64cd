"""/v1/responses through a real router and sim engines, driven by the official openai client: translated onto
chat completions (the sim serves no /v1/responses), text, streams, a function tool call and its output turn;
and passed through to an engine of a kind that serves it (vLLM, imitated: no GPU here)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from llmgw_router.app import serve
from llmgw_router.path.service import Router, RouterOptions
from support import free_port, wait_for

from llmgw.core.snapshot import RouterSnapshot

from .helpers import SIM_VERIFIED, SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

_COMPLETED = {"type": "response.completed", "sequence_number": 1}
_COMPLETED["response"] = {"id": "resp_v", "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}
NATIVE_STREAM = (
    b'event: response.created\ndata: {"type": "response.created", "sequence_number": 0, '
    b'"response": {"id": "resp_v", "usage": null}}\n\n'
    b"event: response.completed\ndata: " + json.dumps(_COMPLETED).encode() + b"\n\n"
)
LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("sim-chat", "engine-key-r")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


def snapshot(endpoints: list[dict[str, Any]]) -> RouterSnapshot:
    model = {"context_length": 2048, "capabilities": ["chat", "tools"], "simulated": True}
    return RouterSnapshot.model_validate(
        {"revision": "r1", "models": {"sim-chat": model}, "endpoints": endpoints}
    )


@pytest.fixture
async def gateway(sim: SimProcess) -> AsyncIterator[tuple[Router, openai.AsyncOpenAI]]:
    router = Router(RouterOptions())
    router.apply_snapshot(snapshot([endpoint(sim, "rep-a", verified=SIM_VERIFIED)]))  # tools are asked
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    url = f"http://127.0.0.1:{listeners.api_port}/v1"
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-any", max_retries=0, timeout=60) as c:
            yield router, c
    finally:
        await listeners.close()


def tokens(router: Router, direction: str) -> float | None:
    return router.metrics.registry.get_sample_value(
        "llmgw_router_tokens_total", {"model": "sim-chat", "direction": direction}
    )


async def test_create_answers_a_response_with_text_and_usage(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    router, c = gateway
    resp = await c.responses.create(
        model="sim-chat", input="hello there", instructions="Answer briefly.", max_output_tokens=5
    )
    assert resp.object == "response" and resp.id.startswith("resp_")
    # The sim always generates up to the cap: the Response says it was cut off there, as OpenAI does.
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert len(resp.output_text.split()) == 5
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"
    assert resp.usage is not None and resp.usage.output_tokens == 5 and resp.usage.input_tokens > 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.instructions == "Answer briefly."
    await wait_for(lambda: tokens(router, "completion") == 5, 10, "completion tokens charged")


async def test_stream_sends_the_events_the_sdk_accumulates(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    _, c = gateway
    events = []
    async with c.responses.stream(model="sim-chat", input="tell me", max_output_tokens=4) as stream:
        async for event in stream:
            events.append(event)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 4
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = next(e for e in events if e.type == "response.output_text.done")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert done.text == deltas and len(deltas.split()) == 4
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.usage is not None
    assert last.response.usage.output_tokens == 4
    assert last.response.output[0].content[0].text == deltas


async def test_function_call_then_its_output_turn(gateway: tuple[Router, openai.AsyncOpenAI]) -> None:
    _, c = gateway
    first = await c.responses.create(model="sim-chat", input="what is a sim?", tools=[LOOKUP])
    assert first.status == "completed"
    call = first.output[0]
    assert call.type == "function_call" and call.name == "lookup" and call.call_id
    assert set(json.loads(call.arguments)) == {"input"}
    second = await c.responses.create(
        model="sim-chat",
        tools=[LOOKUP],
        max_output_tokens=3,
        input=[
            {"role": "user", "content": "what is a sim?"},
            {"type": "function_call", "call_id": call.call_id, "name": "lookup", "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "a simulated engine"},
        ],
    )
    # After the tool's result the sim answers in text (it calls tools only when the last turn is not one).
    assert second.output[0].type == "message" and len(second.output_text.split()) == 3


async def test_streamed_tool_call_completes_with_its_arguments(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    _, c = gateway
    async with c.responses.stream(
        model="sim-chat",
        input="look something up",
        tools=[LOOKUP],
        tool_choice={"type": "function", "name": "lookup"},
    ) as stream:
        kinds = [e.type async for e in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    call = final.output[0]
    assert final.status == "completed" and call.type == "function_call" and call.name == "lookup"
    assert set(json.loads(call.arguments)) == {"input"}


def city_tool(name: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {"type": "function", "name": name, "description": f"The {name}.", "parameters": params}


TWO_TOOLS: Any = [city_tool("get_weather"), city_tool("get_time")]
ASK_BOTH = "In Paris: use get_weather and get_time."


async def test_parallel_function_calls_whole_and_streamed_then_their_outputs(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    """The loop an agent framework runs: two calls in one Response, streamed item by item, then the Response's
    output items passed back as they came with one output per call, answered in words."""
    _, c = gateway
    whole = await c.responses.create(model="sim-chat", input=ASK_BOTH, tools=TWO_TOOLS)
    assert whole.status == "completed"
    assert [(o.type, getattr(o, "name", None)) for o in whole.output] == [
        ("function_call", "get_weather"),
        ("function_call", "get_time"),
    ]
    async with c.responses.stream(model="sim-chat", input=ASK_BOTH, tools=TWO_TOOLS) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    per_item = [(e.type, getattr(e, "output_index", None)) for e in events if "arguments.delta" not in e.type]
    assert per_item == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.function_call_arguments.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
        ("response.completed", None),
    ]

    def calls(output: list[Any]) -> list[tuple[str, str, str]]:
        return [(o.call_id, o.name, o.arguments) for o in output]

    assert calls(final.output) == calls(whole.output)  # the same calls, ids and all
    outputs = [
        {"type": "function_call_output", "call_id": o.call_id, "output": f"{o.name}: fine"}  # type: ignore[union-attr]
        for o in whole.output
    ]
    asked = {"role": "user", "content": ASK_BOTH}
    answer = await c.responses.create(
        model="sim-chat",
        tools=TWO_TOOLS,
        max_output_tokens=3,
        input=[asked, *(o.model_dump(exclude_none=True) for o in whole.output), *outputs],  # type: ignore[list-item]
    )
    assert [o.type for o in answer.output] == ["message"] and len(answer.output_text.split()) == 3


async def test_parallel_tool_calls_false_and_tool_choice_required(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    _, c = gateway
    one = await c.responses.create(
        model="sim-chat", input=ASK_BOTH, tools=TWO_TOOLS, parallel_tool_calls=False
    )
    assert one.parallel_tool_calls is False
    assert [getattr(o, "name", None) for o in one.output] == ["get_weather"]
    call = one.output[0]
    assert call.type == "function_call"
    turn: Any = [
        {"role": "user", "content": "What is the weather?"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    forced = await c.responses.create(model="sim-chat", input=turn, tools=TWO_TOOLS, tool_choice="required")
    assert forced.tool_choice == "required"
    assert [getattr(o, "name", None) for o in forced.output] == ["get_time"]  # a call, not words
    none = await c.responses.create(
        model="sim-chat", input=ASK_BOTH, tools=TWO_TOOLS, tool_choice="none", max_output_tokens=2
    )
    assert [o.type for o in none.output] == ["message"]


async def test_reasoning_items_passed_back_are_accepted_and_outputs_may_be_parts(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    """A history from a reasoning model (its `reasoning` items, as the Agents SDK passes them back) continues
    here: the reasoning is not sent (chat has no place for it), and an output given as input_text parts is
    the tool message's text. The engine is sent the same conversation as without either."""
    _, c = gateway
    call = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"input": "sim"}'}
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Look it up."}],
    }
    ask = {"role": "user", "content": "what is a sim?"}
    parts = [{"type": "input_text", "text": "a simulated "}, {"type": "input_text", "text": "engine"}]
    with_both: Any = [
        ask,
        reasoning,
        call,
        {"type": "function_call_output", "call_id": "call_1", "output": parts},
    ]
    plain: Any = [
        ask,
        call,
        {"type": "function_call_output", "call_id": "call_1", "output": "a simulated engine"},
    ]
    answers = [
        await c.responses.create(model="sim-chat", tools=[LOOKUP], max_output_tokens=3, input=items)
        for items in (with_both, plain)
    ]
    assert [o.type for o in answers[0].output] == ["message"]
    assert answers[0].output_text == answers[1].output_text  # the sim's words are seeded by the prompt
    assert answers[0].usage is not None and answers[1].usage is not None
    assert answers[0].usage.input_tokens == answers[1].usage.input_tokens
    image = [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]
    with pytest.raises(openai.BadRequestError) as err:
        await c.responses.create(
            model="sim-chat",
            input=[ask, call, {"type": "function_call_output", "call_id": "call_1", "output": image}],
        )
    assert err.value.param == "input[2].output[0]" and "input_text" in err.value.message


async def test_stored_responses_and_builtin_tools_are_clear_400s(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    _, c = gateway
    # Without the content-retention opt-in nothing is kept: continuing gets OpenAI's not-found, saying why.
    with pytest.raises(openai.BadRequestError) as err:
        await c.responses.create(model="sim-chat", input="x", previous_response_id="resp_123")
    body = err.value.body
    assert isinstance(body, dict) and err.value.status_code == 400
    assert {k: body[k] for k in ("type", "param", "code")} == {
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    assert body["message"].startswith("Previous response with id 'resp_123' not found: ")
    assert "content-retention" in body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        await c.responses.create(model="sim-chat", input="x", store=True)
    assert err.value.code == "store_unsupported" and "content-retention" in err.value.message
    ok = await c.responses.create(model="sim-chat", input="x", store=False, max_output_tokens=1)
    assert len(ok.output_text.split()) == 1
    with pytest.raises(openai.BadRequestError) as err:
        await c.responses.create(model="sim-chat", input="x", tools=[{"type": "web_search"}])
    assert err.value.param == "tools[0]" and "only function tools" in err.value.message


async def test_a_vllm_endpoint_is_sent_the_request_as_it_came() -> None:
    """vLLM serves /v1/responses itself: the router tells by the endpoint's engine kind in the snapshot and
    passes the body through (no chat translation), the answer back as it was; usage from its input_tokens.
    Imitated with a small server: vLLM needs a GPU."""
    seen: list[dict[str, Any]] = []

    async def responses(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if body.get("stream"):
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await stream.prepare(request)
            await stream.write(NATIVE_STREAM)
            return stream
        answer = {
            "id": "resp_vllm",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body["model"],
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "native", "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {"input_tokens": 7, "output_tokens": 1, "total_tokens": 8},
        }
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    fake = {
        "replica_id": "rep-v",
        "model": "sim-chat",
        "engine": "vllm",
        "base_url": f"http://127.0.0.1:{port}",
        "api_key": "k",
        "slots": 4,
    }
    router = Router(RouterOptions())
    router.apply_snapshot(snapshot([fake]))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    try:
        url = f"http://127.0.0.1:{listeners.api_port}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-any", max_retries=0) as c:
            resp = await c.responses.create(model="sim-chat", input="hi", max_output_tokens=9)
        assert resp.id == "resp_vllm" and resp.output_text == "native"
        assert seen[0]["input"] == "hi" and seen[0]["max_output_tokens"] == 9 and "messages" not in seen[0]
        await wait_for(lambda: tokens(router, "prompt") == 7, 10, "prompt tokens from input_tokens")
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + "/responses", json={"model": "sim-chat", "input": "hi", "stream": True}) as r,
        ):
            assert r.status == 200 and await r.read() == NATIVE_STREAM  # untouched
        assert seen[1]["stream"] is True and "stream_options" not in seen[1]
        # Charged from the usage inside its last event.
        await wait_for(lambda: tokens(router, "prompt") == 12, 10, "prompt tokens from the stream's end")
    finally:
        await listeners.close()
        await runner.cleanup()
