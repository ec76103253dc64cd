"""The OpenAI Agents SDK against `llmgw up`, as its quickstart runs it: an Agent with a function tool, run by the
Runner to its final output, whole and streamed, on both model classes (Responses and Chat Completions) over the
project's key and base URL."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from clients.gateway import CLIENT_TEST, Gateway, weather

if TYPE_CHECKING:  # imported where used: every xdist worker collects this module, few run it (gateway.py)
    from agents import Agent, RunConfig
    from agents.result import RunResultBase

pytestmark = CLIENT_TEST

MODEL_CLASSES = ("chat", "responses")


def no_tracing() -> RunConfig:
    """Tracing would post spans to OpenAI's own endpoint: the SDK's documented switch for another provider."""
    from agents import RunConfig

    return RunConfig(tracing_disabled=True)


def agent_for(gateway: Gateway, model_class: str, calls: list[str]) -> Agent[Any]:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, function_tool
    from openai import AsyncOpenAI

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now.

        Args:
            city: The city's name.
        """
        calls.append(city)
        return weather(city)

    client = AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.api_key, max_retries=0)
    classes = {"responses": OpenAIResponsesModel, "chat": OpenAIChatCompletionsModel}
    model = classes[model_class](model=gateway.model, openai_client=client)
    # include_usage: a Chat Completions stream reports usage only when asked (the SDK asks only api.openai.com).
    return Agent(
        name="Weather",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(include_usage=True),
    )


def check_loop(result: RunResultBase, calls: list[str]) -> None:
    from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem

    kinds = [type(item) for item in result.new_items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem], kinds
    call, output, _ = result.new_items
    arguments = json.loads(call.raw_item.arguments)
    assert isinstance(arguments["city"], str), arguments
    assert calls == [arguments["city"]], "the tool ran once, with the arguments the model sent"
    assert output.output == weather(arguments["city"]), "the tool's result went back to the model"
    assert isinstance(result.final_output, str) and result.final_output.strip(), result.final_output
    assert len(result.raw_responses) == 2, "one request for the call, one for the answer"
    for response in result.raw_responses:
        assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0, response.usage


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
async def test_agent_runs_a_tool_to_its_final_output(gateway: Gateway, model_class: str) -> None:
    from agents import Runner

    calls: list[str] = []
    result = await Runner.run(
        agent_for(gateway, model_class, calls), "The weather in Paris?", run_config=no_tracing()
    )
    check_loop(result, calls)


@pytest.mark.parametrize("model_class", MODEL_CLASSES)
async def test_agent_streams_a_tool_loop_to_its_final_output(gateway: Gateway, model_class: str) -> None:
    from agents import Runner

    calls: list[str] = []
    streamed = Runner.run_streamed(
        agent_for(gateway, model_class, calls), "The weather in Paris?", run_config=no_tracing()
    )
    text = []
    async for event in streamed.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            text.append(event.data.delta)
    check_loop(streamed, calls)
    assert "".join(text) == streamed.final_output, "the answer came as deltas, in order"
