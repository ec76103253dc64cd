"""The Vercel AI SDK (`ai` with `@ai-sdk/openai-compatible`) against `llmgw up` (tests/clients/node/vercel_ai.mjs):
generateText and streamText with a tool that has `execute`, the SDK sending its result back until the model
answers in words (stopWhen: stepCountIs(5))."""

from __future__ import annotations

import pytest

from clients.gateway import CLIENT_TEST, Gateway
from clients.node_script import run_node

pytestmark = CLIENT_TEST


@pytest.mark.parametrize("mode", ["whole", "stream"])
def test_tool_loop_to_a_final_answer(gateway: Gateway, mode: str) -> None:
    done = run_node(gateway, "vercel_ai.mjs", mode)
    (call,) = done["calls"]
    assert isinstance(call["city"], str), call
    asked, answered = done["steps"]
    assert asked["finishReason"] == "tool-calls", asked
    assert asked["toolCalls"] == [{"toolName": "getWeather", "input": call}], asked
    assert [r["toolName"] for r in asked["toolResults"]] == ["getWeather"], asked
    assert answered["finishReason"] == "stop" and answered["toolCalls"] == [], answered
    assert answered["text"].strip() and answered["text"] == done["text"], done
    assert done["finishReason"] == "stop", done
    if mode == "stream":
        assert len(done["deltas"]) > 1 and "".join(done["deltas"]) == done["text"], (
            "the answer came in pieces"
        )
    usage = done["usage"]
    assert usage["inputTokens"] > 0 and usage["outputTokens"] > 0, usage
