"""`llmgw model check`'s built-in probes, pure: what each probe sends and how its answer is judged.

One probe per declared capability that an engine can get wrong while still answering 200:
- `tools` (capability tools): a tool-call round trip: the engine must answer a request offering one tool
  with a `tool_calls` entry naming it with JSON arguments, then answer the tool's result in words;
- `response_format` (capability chat): a json_schema response_format, answered with JSON valid against it;
- `stream_usage` (capability chat): a stream with `stream_options.include_usage` ends with a usage chunk;
- `vision` (capability vision): a small PNG sent as an `image_url` data URL is answered in words, where an
  engine started without the model's image encoder refuses it (llama-server without `--mmproj`: 500 "image input
  is not supported").

A verdict is recorded per model, engine and engine version (llmgw/controller/loops/model_checks.py keeps them):
the same weights on another engine version may answer differently.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

__all__ = [
    "PROBE_CAPABILITY",
    "ProbeResult",
    "probes_for",
    "response_format_request",
    "response_format_verdict",
    "stream_usage_request",
    "stream_usage_verdict",
    "tools_request",
    "tools_result_request",
    "tools_result_verdict",
    "tools_verdict",
    "vision_request",
    "vision_verdict",
]

# probe -> the capability it verifies (what a router may rely on once it passed)
PROBE_CAPABILITY: dict[str, str] = {
    "tools": "tools",
    "response_format": "response_format",
    "stream_usage": "stream_usage",
    "vision": "vision",
}

_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}

_TOOL_HINTS = {
    "vllm": "start vLLM with --enable-auto-tool-choice --tool-call-parser X (the parser of the model's family)",
    "sglang": "start SGLang with --tool-call-parser X (the parser of the model's family)",
    "llamacpp": "start llama-server with --jinja and a model whose chat template knows tools "
    "(an instruction-tuned model; a base model does not call tools)",
    "sim": "the sim was started with fail_probes: tools",
}


@dataclass(frozen=True, slots=True)
class ProbeResult:
    probe: str
    passed: bool
    detail: str

    def json(self) -> dict[str, Any]:
        return {"probe": self.probe, "passed": self.passed, "detail": self.detail}


def probes_for(capabilities: Sequence[str]) -> list[str]:
    """The probes a model's declared capabilities call for, in a fixed order."""
    out = []
    if "tools" in capabilities:
        out.append("tools")
    if "chat" in capabilities:
        out += ["response_format", "stream_usage"]
    if "vision" in capabilities:
        out.append("vision")
    return out


def tools_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
        "tools": [_TOOL],
        "tool_choice": "auto",
        "max_tokens": 32,  # a call of get_weather(city) fits; a CPU engine answering in text stops soon
        "temperature": 0,
    }


def tools_verdict(response: Any, engine: str) -> tuple[ProbeResult, dict[str, Any] | None]:
    """The first half of the round trip: a tool call of get_weather with JSON arguments (and that call,
    for the second half), else why not, with what to change."""
    message = _message(response)
    hint = _TOOL_HINTS.get(engine, "enable the engine's tool-call parser")
    calls = message.get("tool_calls") if message else None
    if not isinstance(calls, list) or not calls:
        return ProbeResult("tools", False, f"the engine answers in text, not tool_calls — {hint}"), None
    call = calls[0] if isinstance(calls[0], dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    assert isinstance(function, dict)
    if function.get("name") != "get_weather":
        return ProbeResult(
            "tools", False, f"the tool call names {function.get('name')!r}, not 'get_weather'"
        ), None
    try:
        args = json.loads(function.get("arguments") or "")
    except (TypeError, ValueError):
        return ProbeResult(
            "tools", False, f"the tool call's arguments are not JSON: {function.get('arguments')!r}"
        ), None
    if not isinstance(args, dict):
        return ProbeResult("tools", False, "the tool call's arguments are not a JSON object"), None
    return ProbeResult("tools", True, "tool call made"), call


def tools_result_request(model: str, call: dict[str, Any]) -> dict[str, Any]:
    """The second half: the tool's result goes back, the engine must answer in words."""
    body = tools_request(model)
    body["messages"] = [
        *body["messages"],
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call.get("id", "call_0"), "content": '{"weather": "sunny, 21 C"}'},
    ]
    return body


def tools_result_verdict(response: Any) -> ProbeResult:
    message = _message(response)
    content = message.get("content") if message else None
    if isinstance(content, str) and content.strip():
        return ProbeResult("tools", True, "ok: a tool call, and the tool's result answered in words")
    return ProbeResult("tools", False, "the tool's result was not answered in words (no message.content)")


def response_format_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Name a city and its population, as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": _SCHEMA}},
        "max_tokens": 64,
        "temperature": 0,
    }


def response_format_verdict(response: Any) -> ProbeResult:
    message = _message(response)
    content = message.get("content") if message else None
    if not isinstance(content, str):
        return ProbeResult("response_format", False, "no message.content in the answer")
    try:
        doc = json.loads(content)
    except ValueError:
        words = f"the answer is not JSON ({content[:60]!r}): the engine ignores response_format"
        return ProbeResult("response_format", False, words)
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(_SCHEMA).iter_errors(doc))
    if error is not None:
        return ProbeResult(
            "response_format", False, f"JSON, but not valid against the schema: {error.message}"
        )
    return ProbeResult("response_format", True, "ok: JSON valid against the schema")


def stream_usage_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 8,
        "temperature": 0,
    }


def stream_usage_verdict(chunks: Sequence[Any]) -> ProbeResult:
    """The chunks of the stream, parsed; the last one carrying `usage` must count completion tokens."""
    if not chunks:
        return ProbeResult("stream_usage", False, "the stream sent no chunk")
    usage = next((c.get("usage") for c in reversed(chunks) if isinstance(c, dict) and c.get("usage")), None)
    if not isinstance(usage, dict):
        words = "the stream ends without a usage chunk: stream_options.include_usage is ignored"
        return ProbeResult("stream_usage", False, words)
    if not isinstance(usage.get("completion_tokens"), int):
        return ProbeResult("stream_usage", False, f"the usage chunk has no completion_tokens: {usage}")
    return ProbeResult("stream_usage", True, f"ok: usage {usage.get('completion_tokens')} completion tokens")


def _png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG (signature, IHDR, one IDAT, IEND), built here rather than kept as a blob."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour, no interlace
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))  # filter 0 on each row
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


_RED_SQUARE = "data:image/png;base64," + base64.b64encode(_png(32, 32, (220, 20, 20))).decode()
_VISION_HINTS = {
    "llamacpp": "llama-server reads images only with the model's multimodal projector (--mmproj FILE) loaded",
    "vllm": "serve a vision model (its processor and image encoder) in vLLM; a text-only model has none",
    "sglang": "serve a vision model in SGLang; a text-only model has no image encoder",
}


def vision_request(model: str) -> dict[str, Any]:
    content = [
        {"type": "text", "text": "What colour is this square? Answer in one word."},
        {"type": "image_url", "image_url": {"url": _RED_SQUARE}},
    ]
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0,
    }


def vision_verdict(response: Any, error: str | None, engine: str) -> ProbeResult:
    """An image answered in words passes; a refusal of it (or no words) fails, with what to change."""
    hint = _VISION_HINTS.get(engine, "serve a model with an image encoder")
    if error is not None:
        return ProbeResult("vision", False, f"{error} — {hint}")
    message = _message(response)
    content = message.get("content") if message else None
    if isinstance(content, str) and content.strip():
        return ProbeResult("vision", True, "ok: an image answered in words")
    return ProbeResult("vision", False, f"an image got no answer in words (no message.content) — {hint}")


def _message(response: Any) -> dict[str, Any] | None:
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None
