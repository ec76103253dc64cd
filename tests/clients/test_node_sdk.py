"""The official openai Node SDK against `llmgw up` (tests/clients/node/openai_sdk.mjs): the tool loop its README
shows, on Chat Completions and on Responses, whole and streamed (the SDK's stream helpers assembling the deltas)."""

from __future__ import annotations

import pytest

from clients.gateway import CLIENT_TEST, Gateway, weather
from clients.node_script import run_node

pytestmark = CLIENT_TEST

INPUT_TOKENS = {"chat": "prompt_tokens", "responses": "input_tokens"}
OUTPUT_TOKENS = {"chat": "completion_tokens", "responses": "output_tokens"}


@pytest.mark.parametrize("mode", ["whole", "stream"])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_tool_loop_to_a_final_answer(gateway: Gateway, api: str, mode: str) -> None:
    done = run_node(gateway, "openai_sdk.mjs", api, mode)
    (call,) = done["calls"]
    assert isinstance(call["city"], str), call
    assert done["results"] == [weather(call["city"])], "the tool's result went back"
    assert isinstance(done["text"], str) and done["text"].strip(), done
    assert len(done["usage"]) == 2, "one request for the call, one for the answer"
    for usage in done["usage"]:
        assert usage is not None and usage[INPUT_TOKENS[api]] > 0 and usage[OUTPUT_TOKENS[api]] > 0, done
