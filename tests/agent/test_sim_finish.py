"""The sim ends an answer as a model does: by itself (`stop`) after its own length when nothing limits it, cut
(`length`) only by the client's max_tokens / max_completion_tokens or by the context; and its bodies carry only
what the OpenAI API documents unless a header asks for the sim's timing field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from llmgw_agent.sim import SIM_INFO_HEADER, Behaviour, SimEngine
from llmgw_agent.sim_model import LatencyConfig, answer_length

from .test_sim import serve

KEY = "k-test"
# The top-level fields the API reference documents for a chat completion and a legacy completion.
CHAT_FIELDS = {"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "service_tier"}


def engine(**cfg: Any) -> SimEngine:
    config = LatencyConfig(prefill_ms_per_token=0.01, decode_ms_per_token=0.1, default_max_tokens=6, **cfg)
    return SimEngine("sim-model", config, api_key=KEY, behaviour=Behaviour(answers=(("capital", "Paris"),)))


@pytest.fixture
async def url() -> AsyncIterator[str]:
    runner, base = await serve(engine())
    yield base
    await runner.cleanup()


async def post(base: str, path: str, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {KEY}", **headers}
        async with http.post(f"{base}/v1/{path}", json=body, headers=headers) as resp:
            return resp.status, await resp.json()


def chat(content: str = "hello there", **fields: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}], **fields}


def test_answer_length_stops_by_itself_unless_cut() -> None:
    assert answer_length(6, None, None) == (6, "stop")
    assert answer_length(6, 10, None) == (6, "stop")  # a limit it does not reach cuts nothing
    assert answer_length(6, 4, None) == (4, "length")
    assert answer_length(6, None, 3) == (3, "length")  # the context
    assert answer_length(None, 9, None) == (9, "length")  # generated text runs until the client's limit
    assert answer_length(6, 6, None) == (6, "stop")
    with pytest.raises(ValueError):
        answer_length(None, None, None)


async def test_no_client_limit_ends_with_stop(url: str) -> None:
    status, body = await post(url, "chat/completions", chat())
    assert status == 200
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert len(choice["message"]["content"].split()) == 6 == body["usage"]["completion_tokens"]
    status, body = await post(url, "completions", {"model": "sim-model", "prompt": "a b c"})
    assert status == 200 and body["choices"][0]["finish_reason"] == "stop"


async def test_the_client_limit_cuts_with_length(url: str) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        status, body = await post(url, "chat/completions", {**chat(), field: 3})
        assert status == 200
        assert body["choices"][0]["finish_reason"] == "length", field
        assert body["usage"]["completion_tokens"] == 3
    # A configured answer shorter than the limit ends by itself; one longer is cut.
    _, short = await post(url, "chat/completions", chat("the capital?", max_tokens=5))
    assert short["choices"][0]["message"]["content"] == "Paris"
    assert short["choices"][0]["finish_reason"] == "stop"
    _, cut = await post(url, "chat/completions", chat("the capital?", max_tokens=0))
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 0


async def test_the_context_cuts_with_length_and_refuses_a_prompt_over_it() -> None:
    runner, base = await serve(engine(context_length=6))  # "user: one two three" is 4 words
    try:
        status, body = await post(base, "chat/completions", chat("one two three"))
        assert status == 200 and body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 2
        status, body = await post(base, "chat/completions", chat("one two three four five six"))
        assert status == 400 and "maximum context length is 6 tokens" in body["error"]["message"]
    finally:
        await runner.cleanup()


async def test_a_stream_ends_the_same_way(url: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as client:
        finishes = {}
        for limit in (None, 2):
            stream = await client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": "go"}],
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=limit,  # None is sent as null: no limit, as OpenAI reads it
            )
            chunks = [chunk async for chunk in stream]
            finishes[limit] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            assert chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == (6 if limit is None else limit)
            assert "llmgw_sim" not in (chunks[-1].model_extra or {})
    assert finishes == {None: "stop", 2: "length"}


async def test_bodies_carry_only_documented_fields_unless_asked(url: str) -> None:
    _, plain = await post(url, "chat/completions", chat(max_tokens=2))
    assert set(plain) <= CHAT_FIELDS, set(plain) - CHAT_FIELDS
    assert set(plain["choices"][0]["message"]) == {"role", "content", "refusal"}
    _, completion = await post(url, "completions", {"model": "sim-model", "prompt": "a", "max_tokens": 1})
    assert set(completion) <= CHAT_FIELDS, set(completion) - CHAT_FIELDS
    _, asked = await post(url, "chat/completions", chat(max_tokens=2), **{SIM_INFO_HEADER: "1"})
    assert set(asked) - CHAT_FIELDS == {"llmgw_sim"}
    assert asked["llmgw_sim"]["decode_ms"] == 2 * 0.1
