"""`POST /v1/messages` and `GET /v1/models/{id}` through a real router in front of real sim engine processes,
driven by the official `anthropic` and `openai` clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.service import Router, RouterOptions

from llmgw.core.snapshot import RouterSnapshot
from llmgw.store.records import UsageRecord

from .helpers import SIM_VERIFIED, SimProcess, endpoint, start_sim, wait_healthy_sync
from .test_integration import KEY_P1, client, keys, snapshot

pytestmark = pytest.mark.integration

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    procs = [start_sim("sim-chat", "engine-key-a"), start_sim("sim-chat", "engine-key-b")]
    try:
        wait_healthy_sync(procs)
        yield procs
    finally:
        for p in procs:
            p.kill()


class Sink:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def record(self, rec: UsageRecord) -> None:
        self.records.append(rec)


@pytest.fixture
async def gateway(sims: list[SimProcess]) -> AsyncIterator[tuple[Router, str, Sink]]:
    sink = Sink()
    router = Router(RouterOptions(router_id="r1"), Authenticator(keys()), usage=sink)
    models = snapshot(sims).model_dump(mode="json")["models"]
    # A model p1 may use (`sim-*`) that cannot chat: Messages is gated by the chat capability.
    models["sim-embed"] = {"context_length": 2048, "capabilities": ["embeddings"], "simulated": True}
    # The tool turns need endpoints whose tools probe passed (the controller's automatic check publishes it).
    verified = [endpoint(s, f"rep-{i}", verified=SIM_VERIFIED) for i, s in zip("ab", sims, strict=True)]
    router.apply_snapshot(snapshot(sims, models=models, endpoints=verified))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        yield router, f"http://127.0.0.1:{listeners.api_port}", sink
    finally:
        await listeners.close()


def claude(url: str, key: str = KEY_P1) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0, timeout=60)


async def test_messages_create_answers_in_anthropics_shape_and_is_accounted(
    gateway: tuple[Router, str, Sink],
) -> None:
    router, url, sink = gateway
    async with claude(url) as c:
        message = await c.messages.create(
            model="chat",
            max_tokens=4,
            system=[{"type": "text", "text": "You are a sim."}],
            messages=[{"role": "user", "content": "hello there"}],
        )
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.model == "sim-chat"  # asked by alias, answered by the model's name, as chat is
    assert [b.type for b in message.content] == ["text"]
    assert len(message.content[0].text.split()) == 4  # type: ignore[union-attr]
    assert message.stop_reason == "max_tokens"  # the sim always runs to max_tokens ("length")
    assert message.usage.output_tokens == 4 and message.usage.input_tokens > 0
    rec = sink.records[-1]
    assert (rec.project, rec.key_id, rec.model, rec.status) == ("p1", "key-1", "sim-chat", 200)
    assert (rec.tokens_in, rec.tokens_out) == (message.usage.input_tokens, 4)
    completion = router.metrics.registry.get_sample_value(
        "llmgw_router_tokens_total", {"model": "sim-chat", "direction": "completion"}
    )
    assert completion == 4


async def test_messages_stream_sends_anthropics_event_sequence(gateway: tuple[Router, str, Sink]) -> None:
    _, url, sink = gateway
    async with (
        claude(url) as c,
        c.messages.stream(
            model="sim-chat", max_tokens=5, messages=[{"role": "user", "content": "stream please"}]
        ) as stream,
    ):
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    raw = [k for k in kinds if k not in ("text", "content_block")]  # the SDK's own derived events
    assert raw[:2] == ["message_start", "content_block_start"] and raw[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert raw.count("content_block_delta") == 5 and raw.count("content_block_stop") == 1
    assert len(final.content[0].text.split()) == 5  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 5 and final.usage.input_tokens > 0
    rec = sink.records[-1]
    assert (rec.status, rec.tokens_in, rec.tokens_out) == (200, final.usage.input_tokens, 5)


async def test_a_tool_use_turn_then_a_tool_result_turn(gateway: tuple[Router, str, Sink]) -> None:
    _, url, _ = gateway
    question: Any = {"role": "user", "content": "What is the weather in Paris?"}
    async with claude(url) as c:
        first = await c.messages.create(model="sim-chat", max_tokens=20, tools=[WEATHER], messages=[question])
        assert first.stop_reason == "tool_use"
        (use,) = [b for b in first.content if b.type == "tool_use"]
        assert use.name == "get_weather" and use.input == {"city": "sim"}  # the sim's sample for a string
        answer = {"type": "tool_result", "tool_use_id": use.id, "content": "18 C and sunny"}
        second = await c.messages.create(
            model="sim-chat",
            max_tokens=3,
            tools=[WEATHER],
            messages=[
                question,
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [answer]},
            ],
        )
        assert [b.type for b in second.content] == ["text"] and second.stop_reason == "max_tokens"
        # The same call streamed: input_json_delta pieces the SDK puts back together.
        async with c.messages.stream(
            model="sim-chat", max_tokens=20, tools=[WEATHER], messages=[question]
        ) as stream:
            streamed = await stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    (block,) = streamed.content
    assert block.type == "tool_use" and block.input == {"city": "sim"} and block.id == use.id


CLOCK = {
    "name": "get_time",
    "description": "The time in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def test_parallel_tool_use_whole_and_streamed_then_both_results(
    gateway: tuple[Router, str, Sink],
) -> None:
    """Two tool_use blocks in one answer (streamed: one content block each, its input in input_json_delta
    pieces), both results in one user turn, then words; `disable_parallel_tool_use` asks for one."""
    _, url, _ = gateway
    question: Any = {"role": "user", "content": "In Paris: use get_weather and get_time."}
    tools: Any = [WEATHER, CLOCK]
    async with claude(url) as c:
        whole = await c.messages.create(model="sim-chat", max_tokens=50, tools=tools, messages=[question])
        assert whole.stop_reason == "tool_use"
        assert [(b.type, getattr(b, "name", None)) for b in whole.content] == [
            ("tool_use", "get_weather"),
            ("tool_use", "get_time"),
        ]
        async with c.messages.stream(
            model="sim-chat", max_tokens=50, tools=tools, messages=[question]
        ) as stream:
            events = [e async for e in stream]
            streamed = await stream.get_final_message()
        starts = [e.index for e in events if e.type == "content_block_start"]
        stops = [e.index for e in events if e.type == "content_block_stop"]
        deltas = {
            e.index for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        }
        assert starts == stops == [0, 1] and deltas == {0, 1}
        assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "fine"}
            for b in whole.content
            if b.type == "tool_use"
        ]
        turn: Any = [
            question,
            {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
            {"role": "user", "content": results},
        ]
        answer = await c.messages.create(model="sim-chat", max_tokens=3, tools=tools, messages=turn)
        assert [b.type for b in answer.content] == ["text"]
        one = await c.messages.create(
            model="sim-chat",
            max_tokens=50,
            tools=tools,
            messages=[question],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        )
        assert [getattr(b, "name", None) for b in one.content] == ["get_weather"]


async def test_tool_choice_any_forces_a_tool_and_none_forbids_one(gateway: tuple[Router, str, Sink]) -> None:
    _, url, _ = gateway
    question: Any = {"role": "user", "content": "What is the weather?"}
    tools: Any = [WEATHER, CLOCK]
    async with claude(url) as c:
        first = await c.messages.create(
            model="sim-chat", max_tokens=50, tools=tools, messages=[question], tool_choice={"type": "any"}
        )
        (use,) = first.content
        assert use.type == "tool_use" and use.name == "get_weather"
        turn: Any = [
            question,
            {"role": "assistant", "content": [use.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
        ]
        forced = await c.messages.create(
            model="sim-chat", max_tokens=50, tools=tools, messages=turn, tool_choice={"type": "any"}
        )
        assert forced.stop_reason == "tool_use" and [getattr(b, "name", None) for b in forced.content] == [
            "get_time"
        ]
        named = await c.messages.create(
            model="sim-chat",
            max_tokens=50,
            tools=tools,
            messages=turn,
            tool_choice={"type": "tool", "name": "get_weather"},
        )
        assert [getattr(b, "name", None) for b in named.content] == ["get_weather"]
        none = await c.messages.create(
            model="sim-chat", max_tokens=3, tools=tools, messages=[question], tool_choice={"type": "none"}
        )
        assert [b.type for b in none.content] == ["text"]


async def test_refusals_come_in_anthropics_shape(gateway: tuple[Router, str, Sink]) -> None:
    _, url, _ = gateway
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}]}
    async with aiohttp.ClientSession() as s:
        headers = {"x-api-key": KEY_P1, "anthropic-version": "2023-06-01"}
        async with s.post(url + "/v1/messages", json=body, headers=headers) as r:
            assert r.status == 400
            assert await r.json() == {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
                "request_id": r.headers["x-request-id"],
            }
        async with s.post(url + "/v1/messages", json={**body, "max_tokens": 2}) as r:
            err = await r.json()
            assert r.status == 401 and err["type"] == "error"
            assert err["error"]["type"] == "authentication_error"
    async with claude(url) as c:
        with pytest.raises(anthropic.NotFoundError) as nf:
            await c.messages.create(model="nope", max_tokens=2, messages=[body["messages"][0]])  # type: ignore[list-item]
        assert nf.value.body == {
            "type": "error",
            "error": {
                "type": "not_found_error",
                "message": "The model `nope` does not exist or you do not have access to it.",
            },
            "request_id": nf.value.response.headers["x-request-id"],
        }
        with pytest.raises(anthropic.BadRequestError) as cap:
            await c.messages.create(model="sim-embed", max_tokens=2, messages=[body["messages"][0]])  # type: ignore[list-item]
        assert "does not serve `chat`" in str(cap.value)
    async with claude(url, key="sk-llmgw-" + "z" * 43) as c:
        with pytest.raises(anthropic.AuthenticationError):
            await c.messages.create(model="sim-chat", max_tokens=2, messages=[body["messages"][0]])  # type: ignore[list-item]


async def test_bearer_works_as_well_as_x_api_key_and_dropped_fields_are_named(
    gateway: tuple[Router, str, Sink],
) -> None:
    _, url, _ = gateway
    async with anthropic.AsyncAnthropic(base_url=url, auth_token=KEY_P1, max_retries=0) as c:
        raw = await c.messages.with_raw_response.create(
            model="sim-chat",
            max_tokens=2,
            messages=[{"role": "user", "content": "x"}],
            # The sim takes no top_k: dropped by the router's field plan, as for chat (this SDK version
            # has no top_k argument). `thinking` does not translate.
            extra_body={"top_k": 5, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        )
        assert raw.http_request.headers.get("authorization") == f"Bearer {KEY_P1}"
        assert "x-api-key" not in raw.http_request.headers
        assert set(raw.headers["x-llmgw-dropped-fields"].split(",")) == {"thinking", "top_k"}
        assert (await raw.parse()).usage.output_tokens == 2


async def test_models_retrieve_gives_the_listed_card_and_hides_what_the_caller_may_not_see(
    gateway: tuple[Router, str, Sink],
) -> None:
    _, url, _ = gateway
    async with client(url) as c:
        listed = {m.id: m.model_dump() for m in (await c.models.list()).data}
        card = await c.models.retrieve("sim-chat")
        assert card.model_dump() == listed["sim-chat"]
        # By an alias, as a request may name it: the model's own card (its id, the alias among its aliases).
        assert (await c.models.retrieve("chat")).model_dump() == listed["sim-chat"]
        errors = []
        for hidden in ("other", "nope", "a/b"):  # not allowed to p1, does not exist, an id with a slash
            with pytest.raises(openai.NotFoundError) as nf:
                await c.models.retrieve(hidden)
            errors.append(nf.value.body)
    assert errors[0] == {
        "message": "The model `other` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert [e["message"].replace("nope", "other") for e in errors[:2]] == [errors[0]["message"]] * 2  # type: ignore[index]
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/v1/models/sim-chat") as r:
            assert r.status == 401  # no key, no card
        async with s.post(url + "/v1/models/sim-chat", headers={"Authorization": f"Bearer {KEY_P1}"}) as r:
            assert r.status == 405 and r.headers["Allow"] == "GET, HEAD"


async def test_a_stream_the_engine_ends_early_ends_with_anthropics_error_event() -> None:
    from llmgw.adapters.keys import hash_key

    from .test_stream_end import EVENTS, KEY, HoldingEngine

    async with HoldingEngine() as engine:
        engine.before, engine.after = [EVENTS[0]], []  # one text event, then the end: no usage, no [DONE]
        engine.finish.set()
        router = Router(RouterOptions(), Authenticator(StaticKeys.from_file_lines([f"{hash_key(KEY)} p1"])))
        router.apply_snapshot(
            RouterSnapshot.model_validate(
                {
                    "revision": "r1",
                    "models": {"m": {"context_length": 2048, "capabilities": ["chat"]}},
                    "tenants": {"organizations": {"o": {}}, "projects": {"p1": {"organization": "o"}}},
                    "endpoints": [
                        {
                            "replica_id": "e1",
                            "model": "m",
                            "engine": "vllm",
                            "base_url": f"http://127.0.0.1:{engine.port}",
                            "api_key": "engine-key",
                        }
                    ],
                }
            )
        )
        listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
        seen: list[str] = []
        try:
            async with claude(f"http://127.0.0.1:{listeners.api_port}", KEY) as c:
                with pytest.raises(anthropic.APIStatusError) as err:
                    async with c.messages.stream(
                        model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
                    ) as stream:
                        async for event in stream:
                            seen.append(event.type)
        finally:
            await listeners.close()
    assert "content_block_delta" in seen and "message_stop" not in seen  # what came before is delivered
    assert err.value.body == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "The engine's stream ended before its end; the answer is incomplete.",
        },
    }
