"""The anthropic SDK's tool use against `llmgw up`'s /v1/messages, as Anthropic's docs run it: a request with
`tools`, the `tool_use` block answered with a `tool_result`, until the model ends its turn in words; whole
(`messages.create`) and streamed (`messages.stream`), on the project's key and the router's address."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from clients.gateway import CITY, CLIENT_TEST, Gateway, weather

if TYPE_CHECKING:  # imported where used: every xdist worker collects this module, few run it (gateway.py)
    import anthropic

pytestmark = CLIENT_TEST

TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "The weather in a city now",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    }
]
# Anthropic's API requires a limit: the one its docs show. A model (and the sim) ends well before it, by itself.
MAX_TOKENS = 1024


def turn(
    client: anthropic.Anthropic, model: str, messages: list[Any], stream: bool
) -> anthropic.types.Message:
    if not stream:
        return client.messages.create(model=model, max_tokens=MAX_TOKENS, tools=TOOLS, messages=messages)
    with client.messages.stream(model=model, max_tokens=MAX_TOKENS, tools=TOOLS, messages=messages) as events:
        text = "".join(events.text_stream)
        message = events.get_final_message()
    assert text == "".join(b.text for b in message.content if b.type == "text"), "the text came as deltas"
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_tool_use_loop_to_the_end_of_the_turn(gateway: Gateway, stream: bool) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=gateway.root_url, api_key=gateway.api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": f"The weather in {CITY}?"}]
    calls: list[str] = []
    replies = []
    for _ in range(5):
        reply = turn(client, gateway.model, messages, stream)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply.content})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if reply.stop_reason != "tool_use":
            break
        results = []
        for use in uses:
            assert use.name == "get_weather" and isinstance(use.input, dict), use
            calls.append(use.input["city"])
            results.append(
                {"type": "tool_result", "tool_use_id": use.id, "content": weather(use.input["city"])}
            )
        messages.append({"role": "user", "content": results})
    # The turn ends in words, by itself: what a framework takes as the end of the loop.
    assert replies[0].stop_reason == "tool_use" and len(replies) == 2, replies
    assert replies[1].stop_reason == "end_turn", replies[1]
    assert len(calls) == 1 and isinstance(calls[0], str), calls
    final = replies[-1]
    assert [b.type for b in final.content] == ["text"] and final.content[0].text.strip(), final
    for reply in replies:
        assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0, reply.usage
