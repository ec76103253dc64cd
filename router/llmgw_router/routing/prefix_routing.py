"""Prefix scoring in the request path: a request's PrefixKey, each candidate's share of it, and what to
remember once the request is placed. The indexes are in prefix.py (pure); the event subscriber in kv_events.py.

Which source answers for an endpoint: its engine's KV events when the endpoint publishes them, the router can
hash the prompt the engine's way (the sim's tokenizer for the sim; for vLLM and SGLang the model's own
tokenizer, loaded from the directory its snapshot record names, `tokenizer_dir`: tokenizer.py), and the stream
is fresh; else the approximate index of what this router sent there. The decision's rationale
names the source per endpoint (`prefix_by=`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.words import parse_duration
from llmgw_router.decisions.fields import SALTED_ENGINES, cache_salt
from llmgw_router.decisions.prefix import (
    ApproxIndex,
    EventIndex,
    HeadMemo,
    PrefixKey,
    sim_chat_lines,
    text_block_hashes,
)
from llmgw_router.decisions.scheduler import Candidate
from llmgw_router.fleet.table import LiveEndpoint
from llmgw_router.routing.tokenizer import PromptTokenizer, TokenizerError

# A policy's staleness is one of a few strings: parsed once each, not on every request that weighs prefixes.
_stale_seconds = functools.lru_cache(maxsize=32)(parse_duration)

__all__ = ["PrefixRouting", "prompt_text"]

log = logging.getLogger(__name__)

_SIM_TOKENIZED_ENGINES = frozenset({"sim"})  # engines that tokenize as the sim does (sim_token_ids)
_REAL_TOKENIZED_ENGINES = frozenset({"vllm", "sglang"})  # the model's tokenizer, where its directory is known
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
        # tokenizer directory -> its tokenizer (None: it failed to load, said once); GGUFs being built
        self._tokenizers: dict[str, PromptTokenizer | None] = {}
        self._loading: dict[str, concurrent.futures.Future[PromptTokenizer]] = {}

    def tokenizer(self, directory: str) -> PromptTokenizer | None:
        """The tokenizer in `directory` (or a `.gguf` file), loaded once; None (and one warning) when it cannot
        be loaded. A GGUF's vocabulary takes seconds to build: it is built in a thread, and until it is ready
        the model's requests are scored approximately (None), never held."""
        if directory in self._tokenizers:
            return self._tokenizers[directory]
        if not directory.endswith(".gguf"):
            return self._loaded(directory, lambda: PromptTokenizer.load(Path(directory)))
        loading = self._loading.get(directory)
        if loading is None:
            self._loading[directory] = loading = concurrent.futures.Future()
            threading.Thread(
                target=_load_into, args=(loading, directory), name="llmgw-gguf-tokenizer", daemon=True
            ).start()
            return None
        if not loading.done():
            return None
        del self._loading[directory]
        return self._loaded(directory, loading.result)

    def _loaded(self, directory: str, load: Callable[[], PromptTokenizer]) -> PromptTokenizer | None:
        try:
            self._tokenizers[directory] = load()
        except TokenizerError as e:
            self._tokenizers[directory] = None
            log.warning(
                "tokenizer directory %s: %s; its model's vLLM/SGLang endpoints are scored from the "
                "approximate prefix index",
                directory,
                e,
            )
        return self._tokenizers[directory]

    def key(
        self,
        body: dict[str, Any],
        policy: RoutingPolicySpec,
        project: str | None,
        tokenizer_dir: str | None = None,
    ) -> PrefixKey | None:
        """None when the policy does not weigh prefixes or the request has no prompt text. `tokenizer_dir`:
        the model's tokenizer directory (its snapshot record's), for the engines that tokenize with it."""
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
        tokenize = None if tokenizer_dir is None else functools.partial(self._real_ids, tokenizer_dir, body)
        return PrefixKey(tuple(approx), text, head, self.memo, tokenize)

    def _real_ids(self, directory: str, body: dict[str, Any]) -> list[int] | None:
        """The prompt's ids as vLLM computes them with the model's tokenizer: the chat template rendered and
        encoded, or a completion's prompt encoded (or given as ids); None when that cannot be done."""
        tok = self.tokenizer(directory)
        if tok is None:
            return None
        messages = body.get("messages")
        try:
            if isinstance(messages, list) and messages:
                return tok.encode_chat(messages)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                return list(prompt)  # already token ids
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str) and prompt:
                return tok.encode_text(prompt)
        except TokenizerError as e:  # a template that rejects these messages: this request only
            log.debug("tokenizer %s: %s; scored approximately", directory, e)
        except Exception as e:  # a tokenizer's failure must never fail the request
            log.debug("tokenizer %s: %r; scored approximately", directory, e)
        return None

    def _real(self, ep: LiveEndpoint, key: PrefixKey) -> bool | None:
        """How the router hashes `ep`'s blocks: False the sim's way, True the model tokenizer's, None not."""
        engine = ep.spec.engine
        if engine in _SIM_TOKENIZED_ENGINES:
            return False
        if engine in _REAL_TOKENIZED_ENGINES and key.tokenize is not None:
            return True
        return None

    def _engine_hashes(
        self, ep: LiveEndpoint, key: PrefixKey, policy: RoutingPolicySpec, project: str
    ) -> tuple[int, ...] | None:
        real = self._real(ep, key)
        if real is None:
            return None
        salt = cache_salt(ep.spec.api_key, project) if ep.spec.engine in SALTED_ENGINES else None
        settings = policy.prefix
        return key.engine_hashes(self._block_size(ep), settings.hash_seed, salt, settings.max_blocks, real)

    def _first_engine_hash(
        self, ep: LiveEndpoint, key: PrefixKey, policy: RoutingPolicySpec, project: str
    ) -> int | None:
        real = self._real(ep, key)
        if real is None:
            return None
        salt = cache_salt(ep.spec.api_key, project) if ep.spec.engine in SALTED_ENGINES else None
        return key.first_engine_hash(self._block_size(ep), policy.prefix.hash_seed, salt, real)

    def _block_size(self, ep: LiveEndpoint) -> int:
        """The engine's block size as its own events say (vLLM's CPU build stores blocks of 128 tokens, its GPU
        builds 16), else the snapshot's."""
        return self.events.block_size(ep.id) or ep.spec.kv_block_size

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
                hashing = (ep.spec.engine, self._block_size(ep), ep.spec.api_key)
                if hashing not in firsts:
                    firsts[hashing] = self._first_engine_hash(ep, key, policy, project)
                first = firsts[hashing]
            eid = ep.id
            if first is not None and self._fresh(eid, now):
                c.prefix_source = "precise"
                if not self.events.match(eid, (first,), now):
                    c.prefix = 0.0  # holds none of it: the whole prompt need not be hashed
                    continue
                hashes = self._engine_hashes(ep, key, policy, project) or (first,)
                held = self.events.match(eid, hashes, now)
                c.prefix = held / len(hashes)
                c.prefix_hash = hashes[held - 1]
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
                self.events.expect(ep.id, (first,), now)  # the same prefix follows it before its events come
                return
            hashes = self._engine_hashes(ep, key, policy, project) or (first,)
            held = self.events.match(ep.id, hashes)
            self.events.routed(ep.id, held < len(hashes), now)
            if held < len(hashes):
                self.events.expect(ep.id, hashes[held:], now)

    def forget(self, keep: Sequence[str]) -> None:
        self.approx.forget(keep)
        self.events.forget(keep)


def _load_into(future: concurrent.futures.Future[PromptTokenizer], directory: str) -> None:
    try:
        future.set_result(PromptTokenizer.load(Path(directory)))
    except TokenizerError as e:
        future.set_exception(e)
    except Exception as e:  # a converter's own failure: a load failure like any other
        future.set_exception(TokenizerError(f"{e!r}"))


class PrefixSettingsDefaults:
    """The indexes' settings until a policy that weighs prefixes is seen (each request's policy sets them)."""

    index_blocks = 32768
    stale_after = 10.0
