"""A chat completions stream translated into the Responses API's events, as a small state machine, pure.

Chat chunks go in (`feed`, parsed JSON), Responses events come out as SSE bytes (`event: TYPE` and `data:`
with a `sequence_number`), in the order the official SDK's `responses.stream` accumulates them:

    response.created, response.in_progress
    per output item: response.output_item.added
        a message:  response.content_part.added, response.output_text.delta..., response.output_text.done,
                    response.content_part.done
        a call:     response.function_call_arguments.delta..., response.function_call_arguments.done
        response.output_item.done
    response.completed (or response.incomplete when the token cap cut it off, response.failed when the engine's
    stream broke off before it said why it finished)

One item is open at a time: chat streams text, then tool calls one index after another.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmgw_router.server import sse
from llmgw_router.surfaces.responses.translate import (
    ResponseIds,
    call_item,
    finish_status,
    message_item,
    output_text,
    response_shell,
    usage_of,
)

__all__ = ["ResponsesStreamTranslator"]


@dataclass(slots=True)
class _Open:
    """The output item being streamed: a message (its text so far) or a function call (its arguments)."""

    index: int
    item: dict[str, Any]
    text: str = ""
    tool_index: int | None = None


class ResponsesStreamTranslator:
    def __init__(self, request: dict[str, Any], ids: ResponseIds, model: str) -> None:
        self._request = request
        self._ids = ids
        self._model = model
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._open: _Open | None = None
        self._finish: Any = None
        self._usage: dict[str, Any] | None = None
        self.done = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse.format_json(obj, kind)

    def _delta(self, kind: str, opened: _Open, piece: str, tail: str) -> bytes:
        """A delta event, the one sent per token: formatted directly (json.dumps of the whole dict costs
        several times as much), the same bytes json.dumps would give."""
        seq, self._seq = self._seq, self._seq + 1
        item_id = json.dumps(opened.item["id"])
        data = (
            f'{{"type": "{kind}", "sequence_number": {seq}, "item_id": {item_id}, '
            f'"output_index": {opened.index}, {tail}"delta": {json.dumps(piece)}'
        )
        extra = ', "logprobs": []}' if kind == "response.output_text.delta" else "}"
        return sse.format_event(f"{data}{extra}".encode(), kind)

    def _response(self, status: str) -> dict[str, Any]:
        response = response_shell(self._request, self._ids, self._model, status)
        response["output"] = list(self._output)
        return response

    def start(self) -> list[bytes]:
        return [
            self._event("response.created", response=self._response("in_progress")),
            self._event("response.in_progress", response=self._response("in_progress")),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if chunk.get("model") and isinstance(chunk["model"], str):
            self._model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self._usage = usage_of(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n > 1 has no Responses form; the first choice is the answer
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._text(text)
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    out += self._call(call)
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
        return out

    def _text(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self._open is None or self._open.item["type"] != "message":
            out += self._close()
            index = len(self._output)
            item = message_item(self._ids.message(index), "", "in_progress")
            self._open = _Open(index, item)
            out.append(self._event("response.output_item.added", output_index=index, item=item))
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=output_text(""),
                )
            )
        opened = self._open
        opened.text += text
        out.append(self._delta("response.output_text.delta", opened, text, '"content_index": 0, '))
        return out

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        fn = call.get("function") or {}
        tool_index = call.get("index", 0)
        if self._open is None or self._open.tool_index != tool_index:
            out += self._close()
            index = len(self._output)
            item_id = self._ids.call(index)
            item = call_item(item_id, call.get("id") or item_id, fn.get("name") or "", "", "in_progress")
            self._open = _Open(index, item, tool_index=tool_index)
            out.append(self._event("response.output_item.added", output_index=index, item=item))
        opened = self._open
        piece = fn.get("arguments")
        if isinstance(piece, str) and piece:
            opened.text += piece
            out.append(self._delta("response.function_call_arguments.delta", opened, piece, ""))
        return out

    def _close(self) -> list[bytes]:
        """End the open item: its done events, and it joins the output."""
        opened, self._open = self._open, None
        if opened is None:
            return []
        item, index, out = opened.item, opened.index, []
        if item["type"] == "message":
            done = message_item(item["id"], opened.text)
            part = done["content"][0]
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self._event("response.output_text.done", **common, text=opened.text, logprobs=[]))
            out.append(self._event("response.content_part.done", **common, part=part))
        else:
            done = call_item(item["id"], item["call_id"], item["name"], opened.text)
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=opened.text,
                )
            )
        self._output.append(done)
        out.append(self._event("response.output_item.done", output_index=index, item=done))
        return out

    def finish(self) -> list[bytes]:
        """The stream's end: close what is open and say how the response ended. Idempotent."""
        if self.done:
            return []
        out, kind, response = self.ending()
        return [*out, self.terminal(kind, response)]

    def ending(self) -> tuple[list[bytes], str, dict[str, Any]]:
        """Close what is open; the terminal event's kind and Response, not yet sent (a stored response is
        kept first, and its `store` says whether that worked)."""
        self.done = True
        out = self._close()
        if self._finish is None:
            response = self._response("failed")
            response["error"] = {"code": "server_error", "message": "The engine's stream ended early."}
            return out, "response.failed", self._with_usage(response)
        status, incomplete = finish_status(self._finish)
        response = self._response(status)
        response["incomplete_details"] = incomplete
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out, kind, self._with_usage(response)

    def _with_usage(self, response: dict[str, Any]) -> dict[str, Any]:
        if self._usage is not None:  # else absent: the schema has no null usage, and unknown is not zero
            response["usage"] = self._usage
        return response

    def terminal(self, kind: str, response: dict[str, Any]) -> bytes:
        return self._event(kind, response=response)
