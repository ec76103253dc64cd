"""LangChain's tool-calling agent against `llmgw up`, as its quickstart builds it: `create_agent` with a
ChatOpenAI model over the project's key and base URL and a `@tool` function, invoked to its final message and
streamed token by token (stream_mode "messages")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clients.gateway import CLIENT_TEST, Gateway, weather

if TYPE_CHECKING:  # imported where used: every xdist worker collects this module, few run it (gateway.py)
    from langchain_core.messages import BaseMessage

pytestmark = CLIENT_TEST

ASK = {"messages": [{"role": "user", "content": "The weather in Paris?"}]}


def agent_for(gateway: Gateway, calls: list[str], *, streaming: bool) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        calls.append(city)
        return weather(city)

    model = ChatOpenAI(
        model=gateway.model,
        base_url=gateway.base_url,
        api_key=gateway.api_key,  # type: ignore[arg-type]
        max_retries=0,
        streaming=streaming,
        stream_usage=True,
    )
    return create_agent(model, tools=[get_weather], system_prompt="Answer with the weather tool.")


def check_loop(messages: list[BaseMessage], calls: list[str]) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    kinds = [type(m) for m in messages]
    assert kinds == [HumanMessage, AIMessage, ToolMessage, AIMessage], kinds
    _, asked, result, answer = messages
    assert isinstance(asked, AIMessage) and isinstance(answer, AIMessage)
    (call,) = asked.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str), call
    assert calls == [call["args"]["city"]], "the tool ran once, with the arguments the model sent"
    assert result.tool_call_id == call["id"] and result.content == weather(call["args"]["city"])
    assert isinstance(answer.content, str) and answer.content.strip(), answer
    for turn in (asked, answer):
        usage = turn.usage_metadata
        assert usage is not None and usage["input_tokens"] > 0 and usage["output_tokens"] > 0, turn


def test_agent_invokes_a_tool_to_its_final_message(gateway: Gateway) -> None:
    calls: list[str] = []
    state = agent_for(gateway, calls, streaming=False).invoke(ASK)
    check_loop(state["messages"], calls)


def test_agent_streams_a_tool_loop_token_by_token(gateway: Gateway) -> None:
    from langchain_core.messages import AIMessageChunk

    calls: list[str] = []
    agent = agent_for(gateway, calls, streaming=True)
    tokens: list[Any] = []
    states: list[dict[str, Any]] = []
    for mode, data in agent.stream(ASK, stream_mode=["messages", "values"]):
        if mode == "messages":
            tokens.append(data[0])  # (message chunk, metadata)
        else:
            states.append(data)
    check_loop(states[-1]["messages"], calls)
    answer = states[-1]["messages"][-1]
    pieces = [t.content for t in tokens if isinstance(t, AIMessageChunk) and t.content]
    assert len(pieces) > 1 and "".join(pieces) == answer.content, "the final answer came in pieces, in order"
