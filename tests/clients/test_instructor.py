"""instructor against `llmgw up`, as its README runs it: a pydantic model as the response_model of an openai
client patched by `instructor.from_openai` (the default TOOLS mode: the model calls a function whose parameters
are the model's schema), whole, streamed as partial objects, and through one validation retry (instructor sends
the error back as the tool's result and reads the next call)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, field_validator

from clients.gateway import CLIENT_TEST, Gateway

if TYPE_CHECKING:  # imported where used: every xdist worker collects this module, few run it (gateway.py)
    import instructor

pytestmark = CLIENT_TEST

ASK = [{"role": "user", "content": "Paris is sunny at 21 degrees. Extract the weather."}]


class Weather(BaseModel):
    city: str
    celsius: int
    sunny: bool


def patched(gateway: Gateway) -> instructor.Instructor:
    import instructor
    import openai

    return instructor.from_openai(
        openai.OpenAI(base_url=gateway.base_url, api_key=gateway.api_key, max_retries=0)
    )


def test_extracts_a_model_from_a_tool_call(gateway: Gateway) -> None:
    weather, completion = patched(gateway).chat.completions.create_with_completion(
        model=gateway.model, response_model=Weather, messages=ASK
    )
    (call,) = completion.choices[0].message.tool_calls or []
    assert call.function.name == "Weather", call
    assert json.loads(call.function.arguments) == weather.model_dump(), "the model is the call's arguments"
    assert completion.usage is not None and completion.usage.completion_tokens > 0, completion.usage


def test_streams_partial_objects_to_the_whole(gateway: Gateway) -> None:
    partials = list(
        patched(gateway).chat.completions.create_partial(
            model=gateway.model, response_model=Weather, messages=ASK
        )
    )
    assert len(partials) > 1, "the arguments arrived in pieces"
    last = partials[-1]
    assert Weather.model_validate(last.model_dump()).model_dump() == last.model_dump(), (
        "the last one is whole"
    )
    assert any(p.model_dump(exclude_none=True) != last.model_dump() for p in partials[:-1]), partials


def test_a_validation_error_is_sent_back_and_retried(gateway: Gateway) -> None:
    seen: list[str] = []

    class Checked(Weather):
        @field_validator("city")
        @classmethod
        def not_the_first_answer(cls, city: str) -> str:
            seen.append(city)
            if len(seen) == 1:
                raise ValueError("name the city the user asked about")
            return city

    sent: list[list[dict[str, Any]]] = []
    client = patched(gateway)
    client.on("completion:kwargs", lambda *args, **kwargs: sent.append(kwargs["messages"]))
    weather = client.chat.completions.create(
        model=gateway.model, response_model=Checked, messages=ASK, max_retries=2
    )
    assert len(seen) == 2 and weather.city == seen[1], seen
    assert len(sent) == 2, "one request, one retry"
    assert "name the city the user asked about" in json.dumps(sent[1]), "the retry carries the error back"
