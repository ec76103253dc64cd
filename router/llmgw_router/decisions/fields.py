"""Which request fields reach an engine, and the per-project prefix-cache salt for vLLM.

A tenant's body is forwarded to engines that read far more than OpenAI's fields, and some of those reach
past the tenant's own request: a request-supplied `chat_template` (vLLM's GHSA-6fvq-23cw-5628 class; SGLang
reads `chat_template_kwargs.chat_template`), `priority` (scheduling against other tenants), llama.cpp's
`id_slot` (the slot holding another tenant's cached prompt), `kv_transfer_params`, `vllm_xargs`. So each
engine gets OpenAI's fields for the endpoint plus the sampling parameters it documents; everything else is
dropped, named in the answer's `x-llmgw-dropped-fields` header (never silently), unless the Cluster's
`spec.router.allowed_request_fields` names it.

`kv_transfer_params` asks an engine to keep a prompt's KV cache for another engine, or to take one: the client's
is dropped like the rest, and the router sets its own on a disaggregated model's two steps (decisions/disagg.py).

vLLM shares its prefix cache across requests; a tenant that can time a cache hit learns whether another
sent the same prefix. vLLM keys the cache by `cache_salt` as well, so the router sets it on every request
to a vLLM engine: an HMAC of the project under the engine's key (a secret derived from the cluster secret,
the same for every router), replacing whatever the client sent. Pure functions: no I/O.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DROPPED_HEADER",
    "SALTED_ENGINES",
    "FieldPlan",
    "allowed_fields",
    "append_fields",
    "apply_plan",
    "cache_salt",
    "plan_fields",
]

DROPPED_HEADER = "x-llmgw-dropped-fields"

_CHAT = frozenset(
    [
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "seed",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "functions",
        "function_call",
        "reasoning_effort",
        "metadata",
        "store",
        "service_tier",
        "modalities",
        "prediction",
    ]
)
_COMPLETIONS = frozenset(
    [
        "model",
        "prompt",
        "suffix",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stream",
        "stream_options",
        "logprobs",
        "echo",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "best_of",
        "logit_bias",
        "user",
        "seed",
    ]
)
_EMBEDDINGS = frozenset(["model", "input", "encoding_format", "dimensions", "user"])
# Cohere/Jina rerank and vLLM's score, as vLLM and llama.cpp take them.
_RERANK = frozenset(["model", "query", "documents", "top_n", "return_documents", "user"])
_SCORE = frozenset(["model", "text_1", "text_2", "user"])
_OPENAI = {
    "chat": _CHAT,
    "completions": _COMPLETIONS,
    "embeddings": _EMBEDDINGS,
    "rerank": _RERANK,
    "score": _SCORE,
}

# Sampling and output-shaping parameters each engine documents, none of which reaches beyond the request.
_ENGINE_EXTRAS: Mapping[str, frozenset[str]] = {
    "vllm": frozenset(
        [
            "top_k",
            "min_p",
            "repetition_penalty",
            "min_tokens",
            "stop_token_ids",
            "ignore_eos",
            "skip_special_tokens",
            "include_stop_str_in_output",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "structured_outputs",
        ]
    ),
    "sglang": frozenset(
        [
            "top_k",
            "min_p",
            "repetition_penalty",
            "min_tokens",
            "stop_token_ids",
            "ignore_eos",
            "skip_special_tokens",
            "regex",
            "ebnf",
            "json_schema",
        ]
    ),
    "llamacpp": frozenset(
        [
            "top_k",
            "min_p",
            "typical_p",
            "repeat_penalty",
            "repeat_last_n",
            "grammar",
            "json_schema",
            "ignore_eos",
        ]
    ),
    "trtllm": frozenset(["top_k", "min_p", "repetition_penalty"]),
    "sim": frozenset(
        ["ignore_eos"]
    ),  # as vLLM's: an answer that runs to max_tokens (how `llmgw bench` sizes load)
}
SALTED_ENGINES = frozenset({"vllm", "sim"})  # the sim keys its prefix cache by the salt as vLLM does

# With no engine key (a cluster without a secret), salts are keyed by this process's own secret: still
# one salt per project, but not the same across routers.
_PROCESS_SECRET = secrets.token_bytes(32)


@dataclass(frozen=True, slots=True)
class FieldPlan:
    """What to change in one engine request: the top-level fields to drop, and the salt to set."""

    drop: tuple[str, ...]
    salt: str | None


@functools.lru_cache(maxsize=256)
def allowed_fields(
    engine: str, kind: str, operator_allowed: tuple[str, ...], surface: frozenset[str] | None = None
) -> frozenset[str]:
    """The top-level fields forwarded to `engine` for requests of `kind`. `surface`: the fields an API surface
    sends as they came, in place of the kind's own (the Responses surface's, to an engine that serves it):
    the surface owns its field set, so this module imports none."""
    own = surface if surface is not None else _OPENAI.get(kind, _CHAT)
    return own | _ENGINE_EXTRAS.get(engine, frozenset()) | frozenset(operator_allowed)


@functools.lru_cache(maxsize=4096)
def cache_salt(engine_key: str | None, project: str) -> str:
    """vLLM's `cache_salt` for `project`: an HMAC of the project name, hex. Not guessable without the key,
    though no client can set it anyway (the router replaces it)."""
    key = engine_key.encode() if engine_key else _PROCESS_SECRET
    return hmac.new(key, b"llmgw-cache-salt\0" + project.encode(), hashlib.sha256).hexdigest()


def plan_fields(
    engine: str,
    kind: str,
    body: Mapping[str, Any],
    operator_allowed: Iterable[str],
    project: str | None,
    engine_key: str | None,
    surface: frozenset[str] | None = None,
) -> FieldPlan | None:
    """What the request to `engine` must lose or gain; None when it goes as it is (the common case, decided
    without copying the body). `surface`: as `allowed_fields` takes it."""
    allowed = allowed_fields(engine, kind, tuple(operator_allowed), surface)
    salted = engine in SALTED_ENGINES and kind not in ("embeddings", "rerank", "score")
    extra = body.keys() - allowed  # one set operation in C; ordered below only when something goes
    if salted and "cache_salt" in body:
        extra.add("cache_salt")
    drop = tuple(k for k in body if k in extra) if extra else ()
    if not drop and not salted:
        return None
    return FieldPlan(drop, cache_salt(engine_key, project or "") if salted else None)


def apply_plan(obj: dict[str, Any], plan: FieldPlan) -> None:
    """Drop and set, in place, on the parsed request body."""
    for name in plan.drop:
        obj.pop(name, None)
    if plan.salt is not None:
        obj["cache_salt"] = plan.salt


def append_fields(raw: bytes, nonempty: bool, fields: bytes) -> bytes | None:
    """The client's bytes with `fields` (`"name":value` pairs, comma-separated, names the body lacks)
    spliced in before the object's closing brace; None when the bytes are not plain UTF-8 JSON (UTF-16 or
    -32, a byte-order mark), which only a re-encoding may change. `nonempty`: the object has fields already.

    Why splice rather than re-encode: the body was parsed and checked already, so its bytes are a JSON
    object and nothing but whitespace follows its closing brace; adding a field at its end is a copy, where
    `json.dumps` of the parsed body costs as much as the parse again (the larger the prompt, the more). The
    engine reads the same fields either way: every field the router reads is as the client sent it, and the
    added ones are last (a parser that lets a repeated name win would take ours; none is repeated, since
    the body lacks them)."""
    start = raw.lstrip()
    if start[:1] != b"{" or start[1:2] == b"\x00":
        return None
    end = raw.rfind(b"}")
    return b"".join((raw[:end], b"," if nonempty else b"", fields, raw[end:]))
