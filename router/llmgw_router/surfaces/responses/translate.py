"""OpenAI's Responses API translated onto chat completions, pure: a request body in, a chat body out; a chat
completion in, a Response object out. The stream's translation is surfaces/responses/stream.py's.

The subset the official SDK's `responses.create` and `responses.stream` use: `input` as a string or items
(messages with input_text / input_image / output_text parts, function_call and function_call_output items,
reasoning items passed back from an earlier turn, which are not sent),
`instructions`, function tools, `tool_choice`, `parallel_tool_calls`, `max_output_tokens`, `temperature`,
`top_p`, `text.format` (onto `response_format`), `metadata` (echoed, not sent: engines do not read it), `user`,
`stream`, and `store` / `previous_response_id` (stored responses, for projects that opted in to content
retention: decided in surfaces/responses/kept.py once the key's project is known, kept in surfaces/responses/keeper.py). Anything
else that would change the answer is a 400 naming the field, never silently dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmgw_router.server.errors import ApiError

__all__ = [
    "NATIVE_ENGINES",
    "PASSED_THROUGH_FIELDS",
    "ResponseIds",
    "from_chat",
    "response_shell",
    "to_chat",
    "usage_of",
]

# Engines that serve /v1/responses themselves (engines.md): the request goes to them as it came.
NATIVE_ENGINES = frozenset({"vllm"})

# Fields translated below, and fields accepted and not sent because they change nothing a chat engine does.
_TRANSLATED = frozenset(
    [
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "metadata",
        "user",
        "stream",
        "store",
        "previous_response_id",
        "conversation",
    ]
)
_HARMLESS = frozenset(
    ["service_tier", "prompt_cache_key", "safety_identifier", "truncation", "include", "stream_options"]
)
# What an engine that serves /v1/responses itself is sent: every field accepted here but the stored responses'
# (a turn that keeps or continues one is always translated: the router keeps it, not the engine).
PASSED_THROUGH_FIELDS = (_TRANSLATED - {"previous_response_id", "conversation"}) | _HARMLESS
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


@dataclass(frozen=True, slots=True)
class ResponseIds:
    """The ids one Response is built with (derived from the request id: the same request, the same ids, which
    keeps the golden tests stable)."""

    response: str
    created_at: int
    store: bool = False  # what the Response says of itself: kept (for now: the keeper may yet fail)
    previous: str | None = None  # the stored response it continues

    @staticmethod
    def of(request_id: str, created_at: int) -> ResponseIds:
        return ResponseIds("resp_" + request_id, created_at)

    def message(self, index: int) -> str:
        return f"msg_{self.response[5:]}_{index}"

    def call(self, index: int) -> str:
        return f"fc_{self.response[5:]}_{index}"


def _bad(message: str, param: str, code: str = "unsupported_field") -> ApiError:
    return ApiError(400, message, code, param=param)


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body for a Responses request, or a 400 that names what cannot be translated.
    `store` and `previous_response_id` are the caller's (responses_kept.plan_storage), after authentication."""
    unknown = sorted(k for k in body if k not in _TRANSLATED and k not in _HARMLESS and body[k] is not None)
    if unknown:
        raise _bad(
            f"`{unknown[0]}` is not supported when /v1/responses is translated onto chat completions "
            f"(supported: {', '.join(sorted(_TRANSLATED - {'conversation'}))}).",
            unknown[0],
        )
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions is not None and not isinstance(instructions, str):
        raise _bad("`instructions` must be a string.", "instructions", "invalid_type")
    messages.extend(_messages(body.get("input")))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for name in ("temperature", "top_p", "user", "parallel_tool_calls"):
        if body.get(name) is not None:
            chat[name] = body[name]
    cap = body.get("max_output_tokens")
    if cap is not None:
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise _bad(
                "`max_output_tokens` must be a whole number >= 1.", "max_output_tokens", "invalid_type"
            )
        chat["max_tokens"] = cap
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the Response's usage comes from it
    return chat


def _messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _bad("`input` must be a string or a non-empty list of input items.", "input", "invalid_type")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"`{where}` must be an object.", where, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": _text(item, "call_id", where),
                "type": "function",
                "function": {"name": _text(item, "name", where), "arguments": item.get("arguments", "")},
            }
            last = out[-1] if out else None
            # Calls made in one turn are one assistant message in chat (its text, if any, and its tool_calls).
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            text = _call_output(item.get("output"), where)
            out.append({"role": "tool", "tool_call_id": _text(item, "call_id", where), "content": text})
        elif kind == "reasoning":
            continue  # a model's own reasoning passed back from an earlier turn: chat has no place for it
        else:
            raise _bad(
                f"`{where}.type` is {json.dumps(kind)[:40]}; translated onto chat completions an input item is "
                "a message, a function_call, a function_call_output or a reasoning item (not sent).",
                where + ".type",
            )
    return out


def _call_output(output: Any, where: str) -> str:
    """A function call's output as a tool message's text: a string as it is, a list of `input_text` parts
    joined, anything else as JSON."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        return json.dumps(output)
    texts = []
    for j, part in enumerate(output):
        if (
            not isinstance(part, dict)
            or part.get("type") != "input_text"
            or not isinstance(part.get("text"), str)
        ):
            at = f"{where}.output[{j}]"
            raise _bad(f"`{at}` must be an input_text part: a chat tool message carries text only.", at)
        texts.append(part["text"])
    return "".join(texts)


def _text(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise _bad(f"`{where}.{name}` must be a non-empty string.", f"{where}.{name}", "invalid_type")
    return value


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = _ROLES.get(item.get("role", ""))
    if role is None:
        raise _bad(
            f"`{where}.role` must be user, system, developer or assistant.", where + ".role", "invalid_type"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise _bad(
            f"`{where}.content` must be a string or a list of parts.", where + ".content", "invalid_type"
        )
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image = {"url": part["image_url"], "detail": part.get("detail") or "auto"}
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise _bad(f"`{at}` must be an input_text, output_text or input_image (with image_url) part.", at)
    if role != "user":  # only user messages take parts in every engine's chat template; join the text
        return {"role": role, "content": "".join(p.get("text", "") for p in parts)}
    return {"role": role, "content": parts}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("`tools` must be a list.", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _bad(
                f"`tools[{i}]` is a {json.dumps(kind)} tool; translated onto chat completions only function "
                "tools are supported (built-in tools such as web_search need OpenAI itself).",
                f"tools[{i}]",
            )
        fn = {"name": _text(tool, "name", f"tools[{i}]")}
        for name in ("description", "parameters", "strict"):
            if tool.get(name) is not None:
                fn[name] = tool[name]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(
        "`tool_choice` must be auto, none, required or {type: function, name}.", "tool_choice", "invalid_type"
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise _bad(
        "`text.format` must be {type: text}, {type: json_object} or {type: json_schema, name, schema}.",
        "text.format",
        "invalid_type",
    )


# ---------------------------------------------------------------------------------------------- the answer


def response_shell(request: dict[str, Any], ids: ResponseIds, model: str, status: str) -> dict[str, Any]:
    """A Response object with the request's settings echoed and no output yet (what a stream starts with).
    `usage` is absent until it is known, and `user` unless the request gave one: OpenAI's published Response
    schema types both as objects/strings, not null."""
    shell: dict[str, Any] = {
        "id": ids.response,
        "object": "response",
        "created_at": ids.created_at,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": ids.previous,
        "store": ids.store,
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": _echo_tools(request.get("tools")),
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "metadata": request.get("metadata") or {},
    }
    if request.get("user") is not None:
        shell["user"] = request["user"]
    return shell


def _echo_tools(tools: Any) -> list[Any]:
    """The request's tools as a Response shows them: a function tool always says its `parameters` and
    `strict` (null when the request did not), as OpenAI's FunctionTool schema requires."""
    return [
        {**t, "parameters": t.get("parameters"), "strict": t.get("strict")}
        if isinstance(t, dict) and t.get("type") == "function"
        else t
        for t in tools or []
    ]


def usage_of(chat_usage: Any) -> dict[str, Any] | None:
    """Chat's usage as the Responses API counts it."""
    if not isinstance(chat_usage, dict):
        return None
    prompt = chat_usage.get("prompt_tokens") or 0
    completion = chat_usage.get("completion_tokens") or 0
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def finish_status(finish_reason: Any) -> tuple[str, dict[str, str] | None]:
    """The Response's status for chat's finish_reason: cut off by the token cap is incomplete, as OpenAI says."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [output_text(text)] if status == "completed" else [],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def from_chat(chat: dict[str, Any], request: dict[str, Any], ids: ResponseIds) -> dict[str, Any]:
    """The Response object for a chat completion answering the translated `request`."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str) and content:
        output.append(message_item(ids.message(0), content))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        item_id = ids.call(len(output))  # numbered by output index, as a stream numbers them
        output.append(
            call_item(item_id, call.get("id") or item_id, fn.get("name", ""), fn.get("arguments") or "")
        )
    status, incomplete = finish_status(choice.get("finish_reason"))
    response = response_shell(request, ids, str(chat.get("model", request.get("model"))), status)
    response["incomplete_details"] = incomplete
    response["output"] = output
    usage = usage_of(chat.get("usage"))
    if usage is not None:
        response["usage"] = usage
    return response
