"""The Responses <-> chat completions translation, both ways and streaming included, held by golden files
(each holds the input beside what it became, to be read as a pair).

Regenerate after an intended change with `LLMGW_UPDATE_GOLDEN=1 pytest tests/router/test_responses_golden.py`
and read the diff before committing it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from llmgw_router.server.errors import ApiError
from llmgw_router.server.exchange import AS_SENT, Headers, HttpReply
from llmgw_router.surfaces.responses.exchange import ResponsesExchange
from llmgw_router.surfaces.responses.translate import ResponseIds, from_chat, to_chat

GOLDEN = Path(__file__).parent / "golden" / "responses"
IDS = ResponseIds.of("req1", 1700000000)


def golden(name: str, obj: Any) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    path = GOLDEN / f"{name}.json"
    if os.environ.get("LLMGW_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with LLMGW_UPDATE_GOLDEN=1 once and read it"
    assert text == path.read_text()


REQUESTS: dict[str, dict[str, Any]] = {
    "request_text": {
        "model": "m",
        "input": "Say hi.",
        "instructions": "Be brief.",
        "max_output_tokens": 20,
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "u1",
        "metadata": {"ticket": "42"},
        "store": False,
    },
    "request_items_tools_schema": {
        "model": "m",
        "stream": True,
        "parallel_tool_calls": False,
        "input": [
            {"role": "developer", "content": "Use the tools."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather in these two cities?"},
                    {"type": "input_image", "image_url": "https://example.com/map.png"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "function_call_output", "call_id": "c2", "output": {"sky": "clear"}},
        ],
        "tools": [
            {
                "type": "function",
                "name": "weather",
                "description": "Weather now.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": True,
            }
        ],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {
            "format": {
                "type": "json_schema",
                "name": "report",
                "schema": {"type": "object", "properties": {"summary": {"type": "string"}}},
                "strict": True,
            }
        },
    },
}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_request_translation(name: str) -> None:
    golden(name, {"responses_request": REQUESTS[name], "chat_request": to_chat(REQUESTS[name])})


def _usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {**usage, "total_tokens": prompt + completion}


ANSWERS: dict[str, dict[str, Any]] = {
    "answer_text": {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi."}, "finish_reason": "stop"}
        ],
        "usage": _usage(12, 2, cached=8),
    },
    "answer_tool_calls": {
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                        },
                        {
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city":"Rome"}'},
                        },
                    ],
                },
            }
        ],
        "usage": _usage(30, 20),
    },
    "answer_cut_at_the_cap": {
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "one two"}, "finish_reason": "length"}
        ],
        "usage": _usage(5, 2),
    },
}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_answer_translation(name: str) -> None:
    request = REQUESTS["request_text"]
    golden(name, {"chat_answer": ANSWERS[name], "response": from_chat(ANSWERS[name], request, IDS)})


class Recorder:
    """The client's side of an exchange: what was written, and whether it ended."""

    method, path, headers, remote = "POST", "/v1/responses", Headers(), None
    surface = AS_SENT

    def __init__(self) -> None:
        self.out = b""
        self.ended = False
        self.reply: HttpReply | None = None

    @property
    def started(self) -> bool:
        return bool(self.out) or self.reply is not None

    async def read_body(self, limit: int) -> bytes:
        return b""

    def respond(self, reply: HttpReply) -> None:
        self.reply = reply

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        pass

    async def write(self, chunk: bytes, limit_s: float) -> None:
        self.out += chunk

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        self.out += last
        self.ended = True

    def abort(self) -> None:
        pass


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    chunk["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def _call(index: int, call_id: str | None = None, name: str | None = None, args: str = "") -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if call_id is not None:
        call.update(id=call_id, type="function")
        call["function"]["name"] = name
    return {"tool_calls": [call]}


STREAMS: dict[str, tuple[list[dict[str, Any]], bool]] = {
    "stream_text": (
        [
            _chunk({"role": "assistant", "content": ""}),
            _chunk({"content": "Hel"}),
            _chunk({"content": "lo."}),
            _chunk({}, "stop"),
            _chunk(None, usage=_usage(9, 2)),
        ],
        True,
    ),
    "stream_text_then_two_calls": (
        [
            _chunk({"role": "assistant", "content": "Checking."}),
            _chunk(_call(0, "call_a", "weather")),
            _chunk(_call(0, args='{"city":')),
            _chunk(_call(0, args='"Oslo"}')),
            _chunk(_call(1, "call_b", "weather", '{"city":"Rome"}')),
            _chunk({}, "tool_calls"),
            _chunk(None, usage=_usage(30, 20)),
        ],
        True,
    ),
    "stream_broken_off": ([_chunk({"role": "assistant", "content": "Hal"})], False),
}


def _sse(chunks: list[dict[str, Any]], done: bool) -> bytes:
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


@pytest.mark.parametrize("name", sorted(STREAMS))
async def test_stream_translation(name: str) -> None:
    chunks, done = STREAMS[name]
    client = Recorder()
    exchange = ResponsesExchange(client)
    exchange.turn.begin({"model": "m", "input": "x", "stream": True}, b"{}", "req1")
    exchange.turn.ids = IDS  # created_at fixed for the golden file
    exchange.start_stream(200, {})
    raw = _sse(chunks, done)
    # Written in pieces that cut events in the middle, as TCP reads do; [DONE] ends it as the proxy does.
    cut = len(raw) // 3
    await exchange.write(raw[:cut], 1)
    await exchange.write(raw[cut : 2 * cut], 1)
    await exchange.write_eof(1, raw[2 * cut :])
    assert client.ended
    events = []
    for block in client.out.decode().split("\n\n")[:-1]:
        head, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        assert data == "data: " + json.dumps(event)  # the delta fast path writes what json.dumps would
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    golden(name, {"chat_chunks": chunks, "chat_done": done, "responses_events": events})


async def test_errors_and_passthrough_replies_are_not_translated() -> None:
    client = Recorder()
    exchange = ResponsesExchange(client)
    exchange.turn.begin({"model": "m", "input": "x"}, b"{}", "req1")
    error = HttpReply(429, b'{"error": {"message": "slow down"}}', {"Content-Type": "application/json"})
    exchange.respond(error)
    assert client.reply is error
    exchange.turn.for_engine("vllm")  # the native engine answered a Response already
    native = HttpReply(200, b'{"object": "response"}', {})
    exchange.respond(native)
    assert client.reply is native


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "x", "background": True}, "background", "unsupported_field"),
        ({"input": []}, "input", "invalid_type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_field"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0]",
            "unsupported_field",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "invalid_type"),
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0]", "unsupported_field"),
        ({"input": "x", "tool_choice": {"type": "mcp"}}, "tool_choice", "invalid_type"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format", "invalid_type"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_type"),
        ({"input": "x", "instructions": ["a"]}, "instructions", "invalid_type"),
    ],
)
def test_what_cannot_be_translated_is_a_400_naming_the_field(
    body: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(ApiError) as err:
        to_chat({"model": "m", **body})
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)
