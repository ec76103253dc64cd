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
from typing import Any
from urllib.parse import urlsplit

__all__ = ["KV_FIELD", "PREFILL_ASK", "decode_body", "kv_host", "near_kv", "prefill_body", "returned_params"]

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
