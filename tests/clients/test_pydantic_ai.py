"""pydantic-ai against `llmgw up`, as its docs run it: an Agent with a plain tool on an OpenAI model over the
project's key and base URL (OpenAIProvider), run to its output whole and streamed, on both model classes
(OpenAIChatModel on Chat Completions, OpenAIResponsesModel on Responses)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from clients.gateway import CLIENT_TEST, Gateway, weather

if TYPE_CHECKING:  # imported where used: every xdist worker collects this module, few run it (gateway.py)
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.usage import RunUsage

pytestmark = CLIENT_TEST

MODEL_CLASSES = ("chat", "responses")


def agent_for(gateway: Gateway, model_class: str, calls: list[str]) -> Agent[None, str]:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    classes = {"responses": OpenAIResponsesModel, "chat": OpenAIChatModel}
    provider = OpenAIProvider(base_url=gateway.base_url, api_key=gateway.api_key)
    agent: Agent[None, str] = Agent(
        classes[model_class](gateway.model, provider=provider),
        instructions="Answer with the weather tool.",
    )

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        calls.append(city)
        return weather(city)

    return agent


def parts(messages: list[ModelMessage]) -> list[Any]:
    return [part for message in messages for part in message.parts]


def check_loop(messages: list[ModelMessage], output: str, usage: RunUsage, calls: list[str]) -> None:
    from pydantic_ai.messages import TextPart, ToolCallPart, ToolReturnPart

    called = [p for p in parts(messages) if isinstance(p, ToolCallPart)]
    returned = [p for p in parts(messages) if isinstance(p, ToolReturnPart)]
    assert len(called) == 1 and called[0].tool_name == "get_weather", called
    city = called[0].args_as_dict()["city"]
    assert isinstance(city, str) and calls == [city], (called, calls)
    assert len(returned) == 1 and returned[0].tool_call_id == called[0].tool_call_id, returned
    assert returned[0].content == weather(city), "the tool's result went back to the model"
    final = parts(messages)[-1]
    assert isinstance(final, TextPart) and final.content == output and output.strip(), final
    assert usage.requests == 2 and usage.tool_calls == 1, usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0, usage


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
async def test_agent_runs_a_tool_to_its_output(gateway: Gateway, model_class: str) -> None:
    calls: list[str] = []
    result = await agent_for(gateway, model_class, calls).run("The weather in Paris?")
    check_loop(result.all_messages(), result.output, result.usage, calls)


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
async def test_agent_streams_a_tool_loop_to_its_output(gateway: Gateway, model_class: str) -> None:
    calls: list[str] = []
    async with agent_for(gateway, model_class, calls).run_stream("The weather in Paris?") as streamed:
        pieces = [piece async for piece in streamed.stream_text(delta=True)]
        output = await streamed.get_output()
    assert len(pieces) > 1 and "".join(pieces) == output, pieces
    check_loop(streamed.all_messages(), output, streamed.usage, calls)


async def test_agent_with_a_structured_output_calls_its_tool_then_the_output_tool(gateway: Gateway) -> None:
    """A pydantic model as `output_type` (the docs' second example): pydantic-ai offers it as one more tool and
    forces a tool call (tool_choice required), so after the function tool's result the model calls the output
    tool, whose arguments are the output."""
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Report(BaseModel):
        city: str
        sunny: bool

    calls: list[str] = []
    provider = OpenAIProvider(base_url=gateway.base_url, api_key=gateway.api_key)
    agent = Agent(OpenAIChatModel(gateway.model, provider=provider), output_type=Report)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        calls.append(city)
        return weather(city)

    result = await agent.run("The weather in Paris?")
    called = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolCallPart)]
    assert [p.tool_name for p in called] == ["get_weather", "final_result"], called
    assert calls == [called[0].args_as_dict()["city"]], calls
    assert isinstance(result.output, Report) and result.output.model_dump() == called[1].args_as_dict()
    assert result.usage.requests == 2 and result.usage.output_tokens > 0, result.usage
