"""The request path's rules on the body, pure: its shape, what it may cost, what goes upstream.

`parse` checks the fields the router acts on; `size` works out the reservation (the prompt's estimate, the
completion's cap per sequence, how many sequences) or refuses a request that cannot fit; `fits` and
`sent_cap` apply that to a fallback model; `session_key` is what a session sticks by; `payload` is the body an
endpoint is sent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from llmgw.core import jsonsafe
from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.snapshot import PublishedModel
from llmgw_router.decisions.fields import FieldPlan, append_fields, apply_plan
from llmgw_router.server.errors import ApiError

__all__ = [
    "NO_COMPLETION",
    "Sizing",
    "conversation_key",
    "fits",
    "parse",
    "payload",
    "sent_cap",
    "session_key",
    "size",
    "valid_traceparent",
]


def parse(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object with the router's own fields of the right types, or 400."""
    try:
        body = jsonsafe.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", "invalid_json")
    _check_types(body)
    return body


# Fields the router itself acts on: checked strictly here, because an engine that coerces them differently
# ("stream": "yes" streams in one and not in the other) would answer in a shape the router does not expect,
# and a client's typo must never count as the engine failing (which would open its breaker for everyone).
_TYPED_FIELDS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("stream", (bool,), "a boolean"),
    ("stream_options", (dict,), "an object"),
    ("max_tokens", (int,), "a whole number"),
    ("max_completion_tokens", (int,), "a whole number"),
    # Multiply the reservation: an engine that read "8" as 8 would generate eight times what was reserved.
    ("n", (int,), "a whole number"),
    ("best_of", (int,), "a whole number"),
)


def _check_types(body: dict[str, Any]) -> None:
    for name, types, words in _TYPED_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        wrong = not isinstance(value, types) or (types == (int,) and isinstance(value, bool))
        if wrong or (types == (int,) and value < 0):
            raise ApiError(
                400,
                f"`{name}` must be {words}{' >= 0' if types == (int,) else ''}, got {json.dumps(value)[:40]}.",
                "invalid_type",
                param=name,
            )


# Kinds that generate nothing: charged for the input only, never streamed, never sent a max_tokens.
NO_COMPLETION = frozenset({"embeddings", "rerank", "score", "images", "transcriptions", "translations"})

# OpenAI's /v1/completions generates 16 tokens when max_tokens is not given (vLLM does the same; llama.cpp would
# run to the end of the context): kept as the cap such a request reserves and is sent.
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Sizing:
    """What a request may cost, in tokens."""

    prompt_estimate: int = 0  # from the body's size
    completion_asked: int | None = None  # max_completion_tokens / max_tokens; None when the client set none
    completion_cap: int = 0  # the most tokens one sequence may generate: what was asked, else the model's cap
    sequences: int = 1  # n / best_of: completions generated at once

    @property
    def completion_reserved(self) -> int:
        return self.completion_cap * self.sequences


def size(raw_bytes: int, body: dict[str, Any], kind: str, model: PublishedModel) -> Sizing:
    """What the request may cost: the prompt's estimate (bytes/4 plus 10%, so an estimate a few percent out
    does not refuse a valid request), the completion per sequence (what the client asked, else the model's
    `max_output_tokens`, else whatever the context leaves after the prompt: what the engine would really
    generate; at most 16 for legacy completions, that API's default), and how many sequences (`n`,
    `best_of`). Raises when it cannot fit."""
    if kind in ("transcriptions", "translations"):  # a form: its text fields, not the audio, are the prompt
        raw_bytes = sum(len(v) for v in body.values() if isinstance(v, str))
    prompt = int(raw_bytes / 4 * 1.1)
    if kind in NO_COMPLETION:
        sizing = Sizing(prompt, None, 0, 1)
    else:
        asked = _asked(body)
        sequences = max([1, *(v for k in ("n", "best_of") if isinstance(v := body.get(k), int))])
        cap = model.max_output_tokens
        if asked is not None and cap is not None and asked > cap:
            raise ApiError(
                400,
                f"max_tokens is {asked}, but this model generates at most {cap} tokens per request; "
                f"ask for {cap} or fewer.",
                "max_tokens_too_large",
                param="max_tokens",
            )
        if asked is not None:
            completion_cap = asked
        else:
            limits = [model.context_length - prompt, *(() if cap is None else (cap,))]
            if kind == "completions":  # the legacy API's documented default, which clients rely on
                limits.append(_COMPLETIONS_DEFAULT_MAX_TOKENS)
            completion_cap = min(limits)
        sizing = Sizing(prompt, asked, completion_cap, sequences)
    completion = sizing.completion_cap
    if prompt + completion > model.context_length or (
        sizing.completion_asked is None and kind not in NO_COMPLETION and completion < 1
    ):
        raise ApiError(
            400,
            f"This model's maximum context length is {model.context_length} tokens, but the request needs about "
            f"{prompt + max(completion, 1)} ({prompt} estimated for the prompt, {max(completion, 1)} for the "
            f"completion). Shorten the messages or lower max_tokens.",
            "context_length_exceeded",
            param="messages",
        )
    return sizing


def _asked(body: dict[str, Any]) -> int | None:
    """The completion length the client asked for (either spelling; types were checked), None when unset."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int):
            return value
    return None


def fits(model: PublishedModel, sizing: Sizing) -> bool:
    """May `model` serve this request as a fallback: does its context hold the prompt and what was asked?"""
    room = model.context_length - sizing.prompt_estimate
    asked = sizing.completion_asked
    if asked is None:  # sent a cap of its own (at least one token), or an embedding (no completion)
        return room >= (1 if sizing.completion_cap else 0)
    return asked <= room and (model.max_output_tokens is None or asked <= model.max_output_tokens)


def sent_cap(model: PublishedModel | None, sizing: Sizing, provider: bool) -> int | None:
    """The max_tokens to send to an engine of `model` for a request that set none (None: send nothing): the
    reserved cap, lowered to what the serving model's context and own cap allow, never raised (the
    reservation was made for the requested model).

    Not sent when the context is what binds and a replica serves: the agent starts engines with the model's
    `context_length` as their limit, so prompt plus completion already stops there, which is exactly what was
    reserved (the prompt's estimate plus the rest of the context); and a number derived from the estimate
    would make vLLM refuse every prompt the estimate under-counts (text in scripts of three UTF-8 bytes per
    token). A provider's real context is not ours to know, so it is always sent the cap."""
    if sizing.completion_asked is not None or model is None:
        return None
    room = model.context_length - sizing.prompt_estimate
    cap = min(sizing.completion_cap, room)
    if model.max_output_tokens is not None:
        cap = min(cap, model.max_output_tokens)
    if cap >= room and not provider:
        return None
    return max(cap, 1)


def session_key(headers: Mapping[str, str], body: dict[str, Any], policy: RoutingPolicySpec) -> str | None:
    """What a session sticks to an endpoint by: the policy's header, else the `user` field, else a hash of the
    conversation's first messages; None when the policy does not weigh sessions."""
    if policy.weights.session <= 0:
        return None
    return conversation_key(headers, body, policy)


def conversation_key(
    headers: Mapping[str, str], body: dict[str, Any], policy: RoutingPolicySpec
) -> str | None:
    """The key `session_key` sticks by, whether or not the policy weighs sessions: a usage row keeps a salted
    hash of it (llmgw.core.traffic.recorded.prefix_hash), so a trace shows which requests shared a session or prefix.
    None: the request has none."""
    settings = policy.session
    header = headers.get(settings.header)
    if header:
        return str(header)
    user = body.get("user")
    if settings.use_user_field and isinstance(user, str) and user:
        return "user:" + user
    head = body.get("messages") or body.get("prompt")
    if isinstance(head, list):
        head = head[: settings.prefix_messages]
    if head is None:
        return None
    # orjson: about four times cheaper than json.dumps here, and every request now pays for this key (its
    # salted hash is recorded with its usage), not only those under a policy that weighs sessions.
    try:
        text = orjson.dumps(head, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits, which json reads and orjson refuses
        text = json.dumps(head, sort_keys=True).encode()
    return "head:" + hashlib.blake2b(text, digest_size=12).hexdigest()


def payload(
    raw: bytes,
    body: dict[str, Any],
    upstream_model: str,
    cap: int | None,
    ask_usage: dict[str, Any] | None,
    fields: FieldPlan | None = None,
) -> bytes:
    """The body sent upstream: the client's bytes as they came, unless the model's name, the cap, the
    usage request (`ask_usage`: the client's stream_options, to which include_usage is added) or the field
    plan (fields.py: what the engine must not get, the cache salt it must) changes it. Only adding fields
    the body lacks is a splice into the client's bytes (fields.append_fields); anything else is encoded
    once from the parsed body."""
    salt = fields.salt if fields is not None else None
    if body.get("model") == upstream_model and not (fields is not None and fields.drop):
        if cap is None and ask_usage is None and salt is None:
            return raw
        added: list[bytes] = []
        if cap is not None and "max_tokens" not in body:
            added.append(b'"max_tokens":%d' % cap)
        if ask_usage is not None and "stream_options" not in body:
            added.append(b'"stream_options":{"include_usage":true}')
        if salt is not None and "cache_salt" not in body:
            added.append(b'"cache_salt":' + orjson.dumps(salt))  # hex: json's text too, a fifth the cost
        if len(added) == (cap is not None) + (ask_usage is not None) + (salt is not None):
            spliced = append_fields(raw, bool(body), b",".join(added))
            if spliced is not None:
                return spliced
    changed = dict(body, model=upstream_model)
    if cap is not None:
        changed["max_tokens"] = cap
    if ask_usage is not None:
        changed["stream_options"] = {**ask_usage, "include_usage": True}
    if fields is not None:
        apply_plan(changed, fields)
    return json.dumps(changed).encode()


_TRACEPARENT_CHARS = frozenset("0123456789abcdef-")


def valid_traceparent(sent: str) -> str | None:
    """The client's W3C traceparent when it has the shape `vv-<32 hex>-<16 hex>-ff` (passed to the engine
    untouched while the router does not trace), else None: nothing else of the client's goes there."""
    if len(sent) == 55 and sent[2] == sent[35] == sent[52] == "-" and _TRACEPARENT_CHARS.issuperset(sent):
        return sent
    return None
