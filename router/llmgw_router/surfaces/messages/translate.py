"""Anthropic's Messages API translated onto chat completions, pure: dicts in, dicts out.

`to_chat` turns a `/v1/messages` request into the chat completions request the rest of the path serves (or
raises an `ApiError` saying what is wrong, as Anthropic would); `from_chat` turns the engine's chat completion
back into an Anthropic message; `error_to_anthropic` gives any error body Anthropic's shape; `MessagesStreamTranslator`
is fed the engine's chat SSE bytes and yields Anthropic's event sequence. What is not translated is in
docs/router.md (*Anthropic Messages*).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from llmgw_router.server import sse
from llmgw_router.server.errors import ApiError

__all__ = [
    "MessagesRequest",
    "MessagesStreamTranslator",
    "anthropic_error",
    "error_to_anthropic",
    "from_chat",
    "to_chat",
]

# Top-level request fields that translate; any other is left out and named in x-llmgw-dropped-fields.
_TRANSLATED = frozenset(
    [
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "metadata",
        "tools",
        "tool_choice",
    ]
)

# Anthropic's error type for each status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A translated request: the chat body, what the answer's translation needs, what was left out."""

    chat: dict[str, Any]
    stop_sequences: tuple[str, ...]
    dropped: tuple[str, ...]


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request", param=param)


def to_chat(body: dict[str, Any]) -> MessagesRequest:
    """The chat completions request for an Anthropic Messages request, or 400 in Anthropic's words."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _bad("max_tokens: Field required", "max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _bad(f"max_tokens: must be a whole number >= 1, got {json.dumps(max_tokens)[:40]}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: must be a non-empty list of {role, content}", "messages")
    chat: dict[str, Any] = {"model": body.get("model"), "max_tokens": max_tokens}
    chat["messages"] = [*_system(body.get("system")), *_messages(messages)]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _bad("stop_sequences: must be a list of strings", "stop_sequences")
        chat["stop"] = stops
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]  # top_k reaches only engines that take it (fields.py drops it elsewhere)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    if body.get("stream") is not None:
        chat["stream"] = body["stream"]
        if body["stream"] is True:  # the usage goes into message_delta, so it is always asked for
            chat["stream_options"] = {"include_usage": True}
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice(body["tool_choice"]))
    dropped = tuple(k for k in body if k not in _TRANSLATED)
    return MessagesRequest(chat, tuple(stops or ()), dropped)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in system):
        return [{"role": "system", "content": "\n\n".join(str(b.get("text", "")) for b in system)}]
    raise _bad("system: must be a string or a list of text blocks", "system")


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise _bad(f"messages.{i}: must be an object with role `user` or `assistant`")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            convert = _assistant if message["role"] == "assistant" else _user
            out.extend(convert(content, f"messages.{i}.content"))
        else:
            raise _bad(f"messages.{i}.content: must be a string or a list of content blocks")
    return out


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _bad(f"{where}: a content block must be an object with a `type`")
    return str(block["type"])


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results become `tool` messages (first: they answer the assistant's calls just
    before), the rest one user message."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind, at = _block_type(block, f"{where}.{j}"), f"{where}.{j}"
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), at)}})
        elif kind == "tool_result":
            tools.append(_tool_result(block, at))
        else:
            raise _bad(
                f"{at}: content blocks of type `{kind}` are not supported here (text, image, tool_result)"
            )
    out = tools
    if parts:
        texts_only = all(p["type"] == "text" for p in parts)
        content: Any = "\n\n".join(p["text"] for p in parts) if texts_only else parts
        out.append({"role": "user", "content": content})
    return out


def _image_url(source: Any, where: str) -> str:
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise _bad(f"{where}.source: an image source must be `base64` (media_type, data) or `url`")


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise _bad(f"{where}.tool_use_id: a tool_result names the tool_use it answers")
    content = block.get("content", "")
    if isinstance(content, list):
        texts = [str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if len(texts) != len(content):
            raise _bad(f"{where}.content: only text blocks are translated inside a tool_result")
        content = "\n\n".join(texts)
    elif not isinstance(content, str):
        raise _bad(f"{where}.content: must be a string or a list of text blocks")
    if block.get("is_error") is True:
        content = "Error: " + content  # chat has no error flag on a tool message; the model reads it in words
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _assistant(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = _block_type(block, f"{where}.{j}")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input", {}), separators=(",", ":"))
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # a model's own reasoning from an earlier turn: chat has no place for it
        else:
            raise _bad(f"{where}.{j}: assistant blocks of type `{kind}` are not supported (text, tool_use)")
    # No text beside tool calls is chat's `null`; an assistant turn with neither stays a (blank) turn.
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("tools: must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise _bad(f"tools.{i}: a tool needs a `name`")
        if tool.get("type") not in (None, "custom"):
            raise _bad(f"tools.{i}: server tools (`{tool['type']}`) are not supported; only client tools")
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema", {})}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    mapped: dict[str, Any]
    if kind == "auto":
        mapped = {"tool_choice": "auto"}
    elif kind == "any":
        mapped = {"tool_choice": "required"}
    elif kind == "none":
        mapped = {"tool_choice": "none"}
    elif kind == "tool" and isinstance(choice.get("name"), str):
        mapped = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    else:
        raise _bad("tool_choice: must be {type: auto|any|none} or {type: tool, name}", "tool_choice")
    if choice.get("disable_parallel_tool_use") is True:
        mapped["parallel_tool_calls"] = False
    return mapped


# ---------------------------------------------------------------------------------------------- answers


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _message_id(chat_id: Any) -> str:
    return "msg_" + (str(chat_id).removeprefix("chatcmpl-") if chat_id else "llmgw")


def _stop(finish: Any, choice: dict[str, Any], stops: tuple[str, ...]) -> tuple[str | None, str | None]:
    """Anthropic's stop_reason and stop_sequence for a chat finish_reason. vLLM names the stop string it
    matched in `stop_reason`; without it a `stop` is an end_turn."""
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return (_STOP_REASONS.get(finish, "end_turn") if finish is not None else None), None


def _usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return {
        "input_tokens": prompt if isinstance(prompt, int) else 0,
        "output_tokens": completion if isinstance(completion, int) else 0,
    }


# What Anthropic's Usage always carries besides the two counts (its published schema requires each, null
# allowed): nothing an engine behind chat completions reports, so null, which says "not known", not zero.
_USAGE_UNKNOWN: dict[str, None] = {
    "cache_creation": None,
    "cache_creation_input_tokens": None,
    "cache_read_input_tokens": None,
    "inference_geo": None,
    "output_tokens_details": None,
    "server_tool_use": None,
    "service_tier": None,
}
# The same for a message_delta's cumulative usage (MessageDeltaUsage).
_DELTA_USAGE_UNKNOWN: dict[str, None] = {
    "cache_creation_input_tokens": None,
    "cache_read_input_tokens": None,
    "output_tokens_details": None,
    "server_tool_use": None,
}
# A message's fields that only Anthropic's own tools fill (code execution's container, a refusal's details).
_NO_DETAILS: dict[str, None] = {"stop_details": None, "container": None}


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "citations": None}


def _tool_use_block(call_id: Any, name: Any, tool_input: dict[str, Any]) -> dict[str, Any]:
    # `caller` direct: the model called the tool itself (not code execution on Anthropic's side).
    return {
        "type": "tool_use",
        "id": call_id,
        "name": name,
        "input": tool_input,
        "caller": {"type": "direct"},
    }


def _tool_input(arguments: Any, name: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ApiError(
            502,
            f"The engine called tool `{name}` with arguments that are not a JSON object: "
            f"{str(arguments)[:200]!r}.",
            "bad_tool_arguments",
            "server_error",
        )
    return parsed


def from_chat(chat: dict[str, Any], stops: tuple[str, ...] = (), model: str | None = None) -> dict[str, Any]:
    """The Anthropic message for a chat completion (its first choice), named `model` when given (the model
    the router served: llama-server names its weights file). ApiError 502 for tool arguments that are not a
    JSON object (Anthropic's `input` is one)."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = _obj(choice.get("message"))
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append(_text_block(text))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        name = function.get("name")
        content.append(_tool_use_block(call.get("id"), name, _tool_input(function.get("arguments"), name)))
    stop_reason, stop_sequence = _stop(choice.get("finish_reason"), choice, stops)
    return {
        "id": _message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model or chat.get("model"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        **_NO_DETAILS,
        "usage": {**_usage(chat.get("usage")), **_USAGE_UNKNOWN},
    }


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}


def error_to_anthropic(status: int, body: bytes) -> dict[str, Any]:
    """Any error body (the router's OpenAI shape, vLLM's, a framework's `detail`) in Anthropic's shape."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    message: Any = None
    if isinstance(obj, dict):
        err = obj.get("error")
        message = err.get("message") if isinstance(err, dict) else err
        message = message or obj.get("message") or obj.get("detail")
    if not isinstance(message, str) or not message:
        message = body[:500].decode("utf-8", "replace") or f"The upstream answered {status}."
    return anthropic_error(status, message)


# ---------------------------------------------------------------------------------------------- streams


# One encoder, made once: json.dumps with its own separators builds a new one on every call.
_compact = json.JSONEncoder(separators=(",", ":")).encode


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return sse.format_event(_compact(data).encode(), event)


def _text_delta(index: int, text: str) -> bytes:
    """_sse("content_block_delta", ...) for a text delta, spelled out: the one event a stream is mostly made of."""
    data = f'{{"type":"content_block_delta","index":{index},"delta":{{"type":"text_delta","text":{_compact(text)}}}}}'
    return sse.format_event(data.encode(), b"content_block_delta")


@dataclass
class MessagesStreamTranslator:
    """Chat completion chunks in, Anthropic stream events out: message_start and a ping at the first chunk,
    one content block per text run or tool call (start, deltas, stop), message_delta with the stop reason and
    usage, message_stop at `[DONE]`. A stream that ends without `[DONE]`, or carries an engine's error event,
    ends with Anthropic's `event: error`."""

    stops: tuple[str, ...] = ()
    model: str | None = None  # the name to show; else each chunk's own
    started: bool = False
    done: bool = False
    _reader: sse.EventReader = field(default_factory=sse.EventReader)
    _block: int = -1  # the open content block's index, -1: none
    _block_kind: str = ""
    _tool_blocks: dict[int, int] = field(default_factory=dict)  # chat tool_call index -> block index
    _stop: tuple[str | None, str | None] = (None, None)
    _usage: dict[str, int] = field(default_factory=dict)

    def feed(self, data: bytes) -> bytes:
        """The Anthropic events for these engine bytes (complete events only; the rest waits)."""
        out: list[bytes] = []
        for raw in self._reader.feed(data):
            if self.done:
                break
            out.extend(self._event(sse.parse(raw)))
        return b"".join(out)

    def finish(self) -> bytes:
        """What ends the client's stream once the engine's has ended: nothing after `[DONE]`, else an error."""
        if self.done:
            return b""
        self.done = True
        return self._error("The engine's stream ended before its end; the answer is incomplete.")

    def _error(self, message: str) -> bytes:
        self.done = True
        return _sse("error", anthropic_error(500, message))

    def _event(self, event: sse.Event) -> Iterator[bytes]:
        if event.done:
            yield from self._end()
            return
        chunk = event.json()
        if isinstance(chunk, dict):
            yield from self._chunk(chunk)

    def _chunk(self, chunk: dict[str, Any]) -> Iterator[bytes]:
        if "error" in chunk:  # vLLM and SGLang report a failure mid-stream as a data event
            err = chunk["error"]
            message = err.get("message") if isinstance(err, dict) else err
            yield self._error(str(message or "The engine failed mid-stream."))
            return
        if not self.started:
            self.started = True
            message = {
                "id": _message_id(chunk.get("id")),
                "type": "message",
                "role": "assistant",
                "model": self.model or chunk.get("model"),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                **_NO_DETAILS,
                # Not known before the engine's usage chunk: message_delta carries the counts.
                "usage": {"input_tokens": 0, "output_tokens": 0, **_USAGE_UNKNOWN},
            }
            yield _sse("message_start", {"type": "message_start", "message": message})
            yield _sse("ping", {"type": "ping"})
        if isinstance(chunk.get("usage"), dict):
            self._usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                yield from self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> Iterator[bytes]:
        delta = _obj(choice.get("delta"))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._block_kind != "text":
                yield from self._open(_text_block(""), "text")
            yield _text_delta(self._block, text)
        for call in delta.get("tool_calls") or ():
            yield from self._tool_delta(call)
        if choice.get("finish_reason") is not None:
            self._stop = _stop(choice["finish_reason"], choice, self.stops)

    def _tool_delta(self, call: dict[str, Any]) -> Iterator[bytes]:
        index = call.get("index", 0)
        function = _obj(call.get("function"))
        if index not in self._tool_blocks:
            yield from self._open(_tool_use_block(call.get("id"), function.get("name"), {}), "tool_use")
            self._tool_blocks[index] = self._block
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments and self._tool_blocks[index] == self._block:
            yield self._delta({"type": "input_json_delta", "partial_json": arguments})

    def _open(self, block: dict[str, Any], kind: str) -> Iterator[bytes]:
        yield from self._close()
        self._block += 1
        self._block_kind = kind
        yield _sse(
            "content_block_start",
            {"type": "content_block_start", "index": self._block, "content_block": block},
        )

    def _close(self) -> Iterator[bytes]:
        if self._block_kind:
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": self._block})
            self._block_kind = ""

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta}
        )

    def _end(self) -> Iterator[bytes]:
        yield from self._close()
        stop_reason, stop_sequence = self._stop
        usage = self._usage or {"input_tokens": 0, "output_tokens": 0}
        yield _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence, **_NO_DETAILS},
                "usage": {**usage, **_DELTA_USAGE_UNKNOWN},
            },
        )
        yield _sse("message_stop", {"type": "message_stop"})
        self.done = True
