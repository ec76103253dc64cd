"""Prefix scoring in the request path: a request's PrefixKey, each candidate's share of it, and what to
remember once the request is placed. The indexes are in prefix.py (pure); the event subscriber in kv_events.py.

Which source answers for an endpoint: its engine's KV events when the endpoint publishes them, the router can
hash the prompt the engine's way (the sim's tokenizer; a real model's tokenizer is not loaded by the router),
and the stream is fresh; else the approximate index of what this router sent there. The decision's rationale
names the source per endpoint (`prefix_by=`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.words import parse_duration
from llmgw_router.fields import SALTED_ENGINES, cache_salt
from llmgw_router.prefix import (
    ApproxIndex,
    EventIndex,
    HeadMemo,
    PrefixKey,
    sim_chat_lines,
    text_block_hashes,
)
from llmgw_router.scheduler import Candidate
from llmgw_router.state import LiveEndpoint

# A policy's staleness is one of a few strings: parsed once each, not on every request that weighs prefixes.
_stale_seconds = functools.lru_cache(maxsize=32)(parse_duration)

__all__ = ["PrefixRouting", "prompt_text"]

log = logging.getLogger(__name__)

_TOKENIZED_ENGINES = frozenset({"sim"})  # engines whose tokenization the router reproduces
_EVENT_BLOCKS_PER_ENDPOINT = 1 << 20  # a bound on memory only: engines evict long before this


def prompt_text(body: dict[str, Any]) -> tuple[str, str] | None:
    """The prompt as the sim renders it (chat messages as `role: content` lines, or a completion's prompt),
    and its head (the first message's line and its newline, when more follows: a token boundary); None when
    the body has neither."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        lines = sim_chat_lines(messages)
        return "\n".join(lines), lines[0] + "\n" if len(lines) > 1 else ""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    return (prompt, "") if isinstance(prompt, str) and prompt else None


class PrefixRouting:
    """The router's prefix indexes and the glue between them, the candidates and the policy."""

    def __init__(self) -> None:
        self.approx = ApproxIndex(PrefixSettingsDefaults.index_blocks)
        self.events = EventIndex(_EVENT_BLOCKS_PER_ENDPOINT, PrefixSettingsDefaults.stale_after)
        self.memo = HeadMemo()
        self._stale: set[str] = set()  # endpoints whose event stream was heard, then went silent
        self.subscribed: dict[str, str] = {}  # endpoint -> the KV-event address subscribed (kv_events.py)

    def key(self, body: dict[str, Any], policy: RoutingPolicySpec, project: str | None) -> PrefixKey | None:
        """None when the policy does not weigh prefixes or the request has no prompt text."""
        if policy.weights.prefix <= 0:
            return None
        found = prompt_text(body)
        if found is None:
            return None
        text, head = found
        settings = policy.prefix
        self.approx.capacity = settings.index_blocks
        self.events.stale_after = _stale_seconds(settings.events_stale_after)
        approx = text_block_hashes(text, settings.block_chars, project or "", settings.max_blocks)
        return PrefixKey(tuple(approx), text, head, self.memo)

    def _engine_hashes(
        self, ep: LiveEndpoint, key: PrefixKey, policy: RoutingPolicySpec, project: str
    ) -> tuple[int, ...] | None:
        if ep.spec.engine not in _TOKENIZED_ENGINES:
            return None
        salt = cache_salt(ep.spec.api_key, project) if ep.spec.engine in SALTED_ENGINES else None
        settings = policy.prefix
        return key.engine_hashes(ep.spec.kv_block_size, settings.hash_seed, salt, settings.max_blocks)

    def _first_engine_hash(
        self, ep: LiveEndpoint, key: PrefixKey, policy: RoutingPolicySpec, project: str
    ) -> int | None:
        if ep.spec.engine not in _TOKENIZED_ENGINES:
            return None
        salt = cache_salt(ep.spec.api_key, project) if ep.spec.engine in SALTED_ENGINES else None
        return key.first_engine_hash(ep.spec.kv_block_size, policy.prefix.hash_seed, salt)

    def annotate(
        self,
        cands: Sequence[Candidate],
        endpoints: Sequence[LiveEndpoint],
        key: PrefixKey,
        policy: RoutingPolicySpec,
        project: str,
        now: float,
    ) -> None:
        """Set each candidate's `prefix` (the share of the prompt's leading blocks it holds) and its source."""
        firsts: dict[tuple[str, int, str | None], int | None] = {}  # a fleet's endpoints mostly share one
        for c, ep in zip(cands, endpoints, strict=True):
            first = None
            if ep.spec.kv_events:
                hashing = (ep.spec.engine, ep.spec.kv_block_size, ep.spec.api_key)
                if hashing not in firsts:
                    firsts[hashing] = self._first_engine_hash(ep, key, policy, project)
                first = firsts[hashing]
            eid = ep.id
            if first is not None and self._fresh(eid, now):
                c.prefix_source = "precise"
                if not self.events.match(eid, (first,)):
                    c.prefix = 0.0  # holds none of it: the whole prompt need not be hashed
                    continue
                hashes = self._engine_hashes(ep, key, policy, project) or (first,)
                c.prefix = self.events.match(eid, hashes) / len(hashes)
            elif key.approx:
                c.prefix = self.approx.match(eid, key.approx) / len(key.approx)
                c.prefix_source = "approx"
            else:
                c.prefix, c.prefix_source = 0.0, "approx"

    def _fresh(self, endpoint: str, now: float) -> bool:
        """`EventIndex.fresh`, saying once when a stream that was heard goes stale and once when it is back."""
        fresh = self.events.fresh(endpoint, now)
        if not fresh and endpoint not in self._stale and self.events.heard(endpoint):
            self._stale.add(endpoint)
            log.warning(
                "endpoint %s: no KV events for %gs after requests that should have stored blocks; its prefix "
                "is scored from the approximate index until they return",
                endpoint,
                self.events.stale_after,
            )
        elif fresh and endpoint in self._stale:
            self._stale.discard(endpoint)
            log.warning("endpoint %s: KV events again; its prefix is scored from them", endpoint)
        return fresh

    def placed(
        self, ep: LiveEndpoint, key: PrefixKey, policy: RoutingPolicySpec, project: str, now: float
    ) -> None:
        """The request went to `ep`: remember its blocks there, and expect an event if it brings new ones."""
        self.approx.record(ep.id, key.approx)
        if ep.spec.kv_events:
            first = self._first_engine_hash(ep, key, policy, project)
            if first is None:
                return
            if not self.events.match(ep.id, (first,)):  # new blocks, and no need to hash them all to know
                self.events.routed(ep.id, True, now)
                return
            hashes = self._engine_hashes(ep, key, policy, project) or (first,)
            self.events.routed(ep.id, self.events.match(ep.id, hashes) < len(hashes), now)

    def forget(self, keep: Sequence[str]) -> None:
        self.approx.forget(keep)
        self.events.forget(keep)


class PrefixSettingsDefaults:
    """The indexes' settings until a policy that weighs prefixes is seen (each request's policy sets them)."""

    index_blocks = 32768
    stale_after = 10.0
