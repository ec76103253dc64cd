"""Golden tests of the Messages <-> chat translation (llmgw_router/surfaces/messages/translate.py), both directions, streams too.

Each case's input is here; its translation is in tests/router/golden/messages/. Regenerate them after an
intended change with `LLMGW_UPDATE_GOLDEN=1 pytest tests/router/test_messages_golden.py` and read the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from llmgw_router.server.errors import ApiError
from llmgw_router.surfaces.messages.translate import (
    MessagesStreamTranslator,
    error_to_anthropic,
    from_chat,
    to_chat,
)

GOLDEN = Path(__file__).parent / "golden" / "messages"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LLMGW_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with LLMGW_UPDATE_GOLDEN=1 once and read it"
    assert text == path.read_text(), f"{name} changed: rerun with LLMGW_UPDATE_GOLDEN=1 if intended"


def pretty(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
    },
}

REQUESTS: dict[str, dict[str, Any]] = {
    "request_text": {
        "model": "m",
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hello"}],
        "stop_sequences": ["\n\nHuman:"],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "metadata": {"user_id": "u-1"},
        "stream": True,
    },
    "request_blocks_and_tools": {
        "model": "m",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two.", "cache_control": {}}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [WEATHER_TOOL, {"name": "noop", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this, and the weather in Paris?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "noop", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no such thing"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ],
    },
}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_requests_translate_to_chat(name: str) -> None:
    translated = to_chat(REQUESTS[name])
    out = {
        "chat": translated.chat,
        "dropped": list(translated.dropped),
        "stop_sequences": list(translated.stop_sequences),
    }
    check_golden(name + ".json", pretty(out))


def chat_answer(message: dict[str, Any], finish: str, **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


ANSWERS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "answer_end_turn": (chat_answer({"role": "assistant", "content": "Hi there."}, "stop"), ()),
    "answer_max_tokens": (chat_answer({"role": "assistant", "content": "Hi th"}, "length"), ()),
    # vLLM names the stop string it matched in `stop_reason`.
    "answer_stop_sequence": (
        chat_answer({"role": "assistant", "content": "Hi"}, "stop", stop_reason="END"),
        ("END",),
    ),
    "answer_tool_use": (
        chat_answer(
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            "tool_calls",
        ),
        (),
    ),
}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_chat_answers_translate_to_messages(name: str) -> None:
    answer, stops = ANSWERS[name]
    check_golden(name + ".json", pretty(from_chat(answer, stops)))


def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> bytes:
    obj: dict[str, Any] = {"id": "chatcmpl-s1", "object": "chat.completion.chunk", "model": "m"}
    obj["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
DONE = b"data: [DONE]\n\n"

STREAMS: dict[str, bytes] = {
    "stream_text": b"".join(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hello"}),
            chunk({"content": " world"}),
            chunk({}, "stop"),
            chunk(None, usage=USAGE),
            DONE,
        ]
    ),
    "stream_text_then_tool": b"".join(
        [
            chunk({"role": "assistant", "content": "Looking."}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_9",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
            chunk({}, "tool_calls"),
            chunk(None, usage=USAGE),
            DONE,
        ]
    ),
    # The engine broke off: no finish, no [DONE]. The client is told, in Anthropic's error event.
    "stream_cut_short": chunk({"role": "assistant", "content": "Hel"}),
    # vLLM reports a failure inside the stream as a data event.
    "stream_engine_error": chunk({"content": "a"}) + b'data: {"error": {"message": "out of KV cache"}}\n\n',
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_chat_streams_translate_to_message_events(name: str) -> None:
    whole = MessagesStreamTranslator()
    text = (whole.feed(STREAMS[name]) + whole.finish()).decode()
    check_golden(name + ".sse", text)
    # The same events however the engine's bytes are cut up on the way.
    piecewise = MessagesStreamTranslator()
    parts = [piecewise.feed(STREAMS[name][i : i + 7]) for i in range(0, len(STREAMS[name]), 7)]
    assert (b"".join(parts) + piecewise.finish()).decode() == text


def test_max_tokens_is_required_as_anthropic_requires_it() -> None:
    with pytest.raises(ApiError) as err:
        to_chat({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert err.value.status == 400 and err.value.message == "max_tokens: Field required"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"max_tokens": 0}, "max_tokens: must be a whole number >= 1"),
        ({"max_tokens": 5, "messages": []}, "messages: must be a non-empty list"),
        ({"max_tokens": 5, "system": 3}, "system: must be a string or a list of text blocks"),
        ({"max_tokens": 5, "tool_choice": {"type": "sometimes"}}, "tool_choice: must be"),
        ({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "w"}]}, "server tools"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages.0.content.0: content blocks of type `document` are not supported",
        ),
    ],
)
def test_bad_requests_say_where_and_what_is_wrong(body: dict[str, Any], words: str) -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    with pytest.raises(ApiError) as err:
        to_chat(request)
    assert err.value.status == 400 and words in err.value.message


@pytest.mark.parametrize(
    ("choice", "chat"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
    ],
)
def test_tool_choices_map_onto_chat(choice: dict[str, Any], chat: dict[str, Any]) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    translated = to_chat({**body, "tools": [WEATHER_TOOL], "tool_choice": choice}).chat
    assert {k: translated[k] for k in chat} == chat and "parallel_tool_calls" not in translated


def test_arguments_that_are_not_an_object_are_a_502_not_an_empty_input() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
    with pytest.raises(ApiError) as err:
        from_chat(chat_answer({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"))
    assert err.value.status == 502 and "`f`" in err.value.message


@pytest.mark.parametrize(
    ("status", "body", "kind", "message"),
    [
        (
            401,
            b'{"error": {"message": "bad key", "type": "invalid_request_error"}}',
            "authentication_error",
            "bad key",
        ),
        (404, b'{"error": {"message": "no model"}}', "not_found_error", "no model"),
        (429, b'{"error": {"message": "slow down"}}', "rate_limit_error", "slow down"),
        (400, b'{"object": "error", "message": "vllm says no"}', "invalid_request_error", "vllm says no"),
        (422, b'{"detail": "unprocessable"}', "api_error", "unprocessable"),
        (503, b"<html>busy</html>", "overloaded_error", "<html>busy</html>"),
    ],
)
def test_errors_take_anthropics_shape(status: int, body: bytes, kind: str, message: str) -> None:
    assert error_to_anthropic(status, body) == {"type": "error", "error": {"type": kind, "message": message}}
