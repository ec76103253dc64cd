"""The two requests of a disaggregated (prefill, decode) request, as vLLM's P/D protocol has them. Pure.

vLLM's disaggregated serving (its `disagg_proxy` and toy proxy examples, docs/features/disagg_prefill.md) goes
in two steps. The prefill is the client's request asking for one token, whole (not streamed), with
`kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false, remote_*: null}`: the engine computes
the prompt's KV cache and keeps it for a remote decode. Its answer carries `kv_transfer_params` naming where
that KV is (`remote_engine_id`, `remote_block_ids`, `remote_host`, `remote_port`, with
`do_remote_prefill: true`). The decode is the client's request as it came with those parameters added: the
engine takes the KV instead of computing the prompt again, and generates (streamed when the client asked).

The client's own `kv_transfer_params` never reaches an engine (decisions/fields.py drops it unless the operator
allows it): only the router asks an engine to keep or take a KV cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "KV_FIELD",
    "PREFILL_ASK",
    "Streamed",
    "continued_body",
    "continued_event",
    "decode_body",
    "kv_host",
    "near_kv",
    "prefill_body",
    "returned_params",
    "streamed",
]

KV_FIELD = "kv_transfer_params"
# What a prefill asks: keep the KV for a decode elsewhere; nothing is to be taken from anywhere.
PREFILL_ASK: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# What a prefill must not carry from the client's request: it is one token, whole.
_NOT_IN_PREFILL = ("stream_options", "max_completion_tokens", "n", "best_of")


def prefill_body(sent: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill step's body, from the body the endpoint would be sent for the whole request (fields
    already planned, the model named as the endpoint knows it): one token, not streamed, KV kept."""
    body = {k: v for k, v in sent.items() if k not in _NOT_IN_PREFILL}
    body["max_tokens"] = 1
    body["stream"] = False
    body[KV_FIELD] = dict(PREFILL_ASK)
    return body


def returned_params(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `kv_transfer_params` a prefill's answer carries; None when it has none (an engine without a KV
    connector answers as a plain engine: there is no KV to decode from)."""
    params = answer.get(KV_FIELD)
    return dict(params) if isinstance(params, dict) and params else None


def decode_body(sent: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The decode step's body: the request as the endpoint would be sent it, with the prefill's parameters."""
    body = dict(sent)
    body[KV_FIELD] = dict(params)
    return body


def kv_host(params: Mapping[str, Any]) -> str | None:
    """The host the prefill's answer says its KV is on (`remote_host`), when it names one."""
    host = params.get("remote_host")
    return host if isinstance(host, str) and host else None


def near_kv(endpoints: Iterable[tuple[str, str]], host: str | None) -> frozenset[str]:
    """Of `(endpoint id, api_base)` pairs, the ids on `host`: where the decode reads the KV without crossing
    the network. Empty when no host is named or none is there (then every decode replica is as near)."""
    if host is None:
        return frozenset()
    return frozenset(ep for ep, base in endpoints if urlsplit(base).hostname == host)


# ---- a decode that broke mid-stream, continued (path/disaggregated/midstream.py)
#
# The client has some of the answer already; the continuation is the request again with that text as the start
# of the answer: for chat, an assistant message holding it, which vLLM continues rather than answering anew when
# asked `continue_final_message: true, add_generation_prompt: false` (its chat template's documented fields;
# SGLang reads the same); for completions, the prompt with the text appended. Its cap is what the client's cap
# leaves. Its events are stamped with the first stream's id, creation time and model, so the client reads one
# stream; the opening role-only event of the second is dropped (the client had one).

_CONTINUE_CHAT = {"continue_final_message": True, "add_generation_prompt": False}
# What a delta may carry that the continuation could not take up (a call's arguments, a model's reasoning).
_NOT_PLAIN = ("tool_calls", "function_call", "reasoning_content", "reasoning")


@dataclass(frozen=True, slots=True)
class Streamed:
    """What a broken stream gave the client: its text, its tokens (one per event carrying text, as the
    engines stream them), the first event's `id`, `created` and `model`, and whether it can be continued (one
    choice of plain text: a tool call, or several choices, cannot be taken up by another engine)."""

    text: str
    tokens: int
    head: Mapping[str, Any]
    continuable: bool


def streamed(events: Iterable[Any]) -> Streamed:
    """Read the parsed data events a client was sent (`sse.Event.json()` of each: None for [DONE], a comment,
    or what is not JSON)."""
    pieces: list[str] = []
    head: dict[str, Any] = {}
    continuable = True
    for obj in events:
        if not isinstance(obj, dict):
            continue
        if not head:
            head = {k: obj[k] for k in ("id", "created", "model") if k in obj}
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            piece, plain = _piece(choice)
            continuable = continuable and plain
            if piece:
                pieces.append(piece)
    return Streamed("".join(pieces), len(pieces), head, continuable)


def _piece(choice: Any) -> tuple[str, bool]:
    """A streamed choice's text (chat delta's content, completion's text), and whether it is plain text of
    the first choice."""
    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
        return "", False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if any(delta.get(k) for k in _NOT_PLAIN):
            return "", False
        text = delta.get("content")
    else:
        text = choice.get("text")
    return (text, True) if isinstance(text, str) else ("", text is None)


def continued_body(kind: str, sent: Mapping[str, Any], done: Streamed) -> dict[str, Any] | None:
    """The continuation's body, from the body the endpoint would be sent for the whole request (fields already
    planned); None when it cannot be continued (not plain text, a prompt that is not one string, or the cap
    spent already)."""
    if not done.continuable:
        return None
    body = {k: v for k, v in sent.items() if k != KV_FIELD}
    cap = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if isinstance(body.get(cap), int):
        body[cap] -= done.tokens
        if body[cap] < 1:
            return None
    if not done.text:
        return body
    if kind == "chat" and isinstance(sent.get("messages"), list):
        body["messages"] = [*sent["messages"], {"role": "assistant", "content": done.text}]
        body.update(_CONTINUE_CHAT)
        return body
    if kind == "completions" and isinstance(sent.get("prompt"), str) and not sent.get("echo"):
        body["prompt"] = sent["prompt"] + done.text
        return body
    return None


def continued_event(obj: dict[str, Any], done: Streamed) -> dict[str, Any] | None:
    """One event of the continuation as the client gets it: stamped as the first stream's, its usage counting
    the first stream's tokens too; None for its opening role-only event."""
    if _opening(obj):
        return None
    stamped = {**obj, **done.head}
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        usage = {**usage, "completion_tokens": usage["completion_tokens"] + done.tokens}
        if isinstance(usage.get("total_tokens"), int):
            usage["total_tokens"] += done.tokens
        stamped["usage"] = usage
    return stamped


def _opening(obj: dict[str, Any]) -> bool:
    """A chat stream's opening event: one choice whose delta names the role and carries no text."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return False
    delta = choices[0].get("delta")
    opens = isinstance(delta, dict) and set(delta) <= {"role", "content"} and not delta.get("content")
    return opens and choices[0].get("finish_reason") is None
