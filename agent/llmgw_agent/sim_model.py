"""The simulated engine's latency model and prefix cache, without I/O.

Deterministic given its inputs: a request's prefill costs `prefill_ms_per_token` per prompt token not covered by
the longest cached prefix, each output token costs `decode_ms_per_token`, at most `max_concurrency` sequences run
at once and the rest wait in arrival order. The prefix cache works like vLLM's: prompts are cut into blocks of
`block_size` tokens, each block is named by a hash chained over the blocks before it (vLLM's own algorithm over
the words' token ids, so KV events name blocks as vLLM's do), and a prompt reuses the longest run of leading
blocks already cached. The cache holds at most `capacity_blocks` blocks, least recently
used evicted first.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import re
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# The sim's whole vocabulary: output is plainly not a model's.
VOCABULARY: tuple[str, ...] = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
)


@dataclass(frozen=True)
class LatencyConfig:
    prefill_ms_per_token: float = 1.0
    decode_ms_per_token: float = 10.0
    max_concurrency: int = 4
    block_size: int = 16
    capacity_blocks: int = 4096
    kv_capacity_tokens: int = 65536
    default_max_tokens: int = 16  # the answer's length when nothing cuts it: where the sim's "model" stops
    hash_seed: str = "0"
    context_length: int | None = None  # prompt plus answer at most (the model's context); None: unbounded


def tokenize(text: str) -> list[str]:
    """Whitespace words stand in for tokens: cheap, deterministic, and a grown prompt keeps its prefix."""
    return text.split()


def token_ids(tokens: list[str]) -> list[int]:
    """Each word's token id: its CRC-32 (the sim has no vocabulary file; CRC-32 is the cheapest stable hash in
    the standard library). The router tokenizes sim prompts with the same function
    (llmgw_router.decisions.prefix.sim_token_ids) to hash them as here."""
    ids = _TOKEN_IDS
    out = []
    for w in tokens:
        found = ids.get(w)
        if found is None:
            if len(ids) >= _TOKEN_IDS_MAX:
                ids.clear()  # a bound on memory; the ids are recomputed, never wrong
            found = ids[w] = zlib.crc32(w.encode())
        out.append(found)
    return out


# The words seen so far and their ids: a dict lookup is several times cheaper than encoding and hashing a word.
_TOKEN_IDS: dict[str, int] = {}
_TOKEN_IDS_MAX = 1 << 20


def _none_hash(seed: str) -> bytes:
    return hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def block_hashes(
    tokens: list[str], block_size: int, seed: str = "0", salt: str | None = None
) -> list[tuple[int, list[int]]]:
    """One hash per full block, vLLM's way (`hash_block_tokens` with sha256: the pickled tuple of the parent
    hash, the block's token ids and the extra keys, the cache salt on the first block; NONE_HASH from the
    seed, vLLM's PYTHONHASHSEED), as the 8-byte integers its KV events carry; with each block's token ids."""
    ids = token_ids(tokens)
    out: list[tuple[int, list[int]]] = []
    parent = _none_hash(seed)
    for i in range(len(ids) // block_size):
        block = ids[i * block_size : (i + 1) * block_size]
        extra = (("cache_salt", salt),) if i == 0 and salt else None  # vLLM 0.32's tagged salt key
        key = (parent, tuple(block), extra)
        digest = _DIGESTS.get(key)
        if digest is None:
            if len(_DIGESTS) >= _DIGESTS_MAX:
                _DIGESTS.clear()
            digest = _DIGESTS[key] = hashlib.sha256(pickle.dumps(key, protocol=5)).digest()
        parent = digest
        out.append((int.from_bytes(parent[-8:], "big"), block))
    return out


# Block digests seen lately, by what they hash: a shared prefix is pickled and hashed once, not per request.
_DIGESTS: dict[tuple[bytes, tuple[int, ...], tuple[tuple[str, str], ...] | None], bytes] = {}
_DIGESTS_MAX = 1 << 18


@dataclass
class CacheChange:
    """What one insert did, as KV events say it: blocks stored (hash, parent hash, token ids), hashes evicted."""

    stored: list[tuple[int, int | None, list[int]]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)


class PrefixCache:
    """LRU set of block hashes; `lookup` counts the cached leading tokens, `insert` records a prompt and says
    which blocks it stored and evicted (for the KV-event publisher)."""

    def __init__(self, block_size: int, capacity_blocks: int, seed: str = "0") -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.seed = seed
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.hits_tokens = 0
        self.queries_tokens = 0
        self._last: tuple[list[str], str | None, list[tuple[int, list[int]]]] | None = None

    def _hashes(self, tokens: list[str], salt: str | None) -> list[tuple[int, list[int]]]:
        """`block_hashes`, remembered for the prompt last asked about: a request's lookup and insert hash
        the same list."""
        last = self._last
        if last is not None and last[0] is tokens and last[1] == salt:
            return last[2]
        hashes = block_hashes(tokens, self.block_size, self.seed, salt)
        self._last = (tokens, salt, hashes)
        return hashes

    def lookup(self, tokens: list[str], salt: str | None = None) -> int:
        hits = 0
        for h, _ in self._hashes(tokens, salt):
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hits += 1
        cached = hits * self.block_size
        self.queries_tokens += len(tokens)
        self.hits_tokens += cached
        return cached

    def insert(self, tokens: list[str], salt: str | None = None) -> CacheChange:
        change = CacheChange()
        if self.capacity_blocks <= 0:
            return change
        parent: int | None = None
        for h, block in self._hashes(tokens, salt):
            if h not in self._blocks:
                change.stored.append((h, parent, block))
            self._blocks[h] = None
            self._blocks.move_to_end(h)
            parent = h
        while len(self._blocks) > self.capacity_blocks:
            change.removed.append(self._blocks.popitem(last=False)[0])
        return change

    def clear(self) -> None:
        self._blocks.clear()


@dataclass(frozen=True)
class Timing:
    prompt_tokens: int
    cached_tokens: int
    prefill_ms: float
    decode_ms_per_token: float


def plan_timing(cfg: LatencyConfig, prompt_tokens: int, cached_tokens: int) -> Timing:
    uncached = max(prompt_tokens - cached_tokens, 0)
    return Timing(prompt_tokens, cached_tokens, uncached * cfg.prefill_ms_per_token, cfg.decode_ms_per_token)


def output_tokens(prompt: list[str], count: int) -> list[str]:
    """Deterministic output from the fixed vocabulary, seeded by the prompt."""
    seed = int.from_bytes(hashlib.sha256(" ".join(prompt).encode()).digest()[:8], "big")
    return [VOCABULARY[(seed + i * 7) % len(VOCABULARY)] for i in range(count)]


def answer_length(natural: int | None, limit: int | None, room: int | None) -> tuple[int, str]:
    """How long an answer is and why it ends, as a model's does: `natural` is where it stops by itself (its
    end-of-sequence: `stop`; None: it goes on until cut); the client's `limit` (max_tokens) or the
    context's `room` after the prompt cut it shorter (`length`)."""
    cuts = [n for n in (limit, room) if n is not None]
    cut = max(min(cuts), 0) if cuts else None
    if natural is None and cut is None:
        raise ValueError("an answer with no end of its own needs a limit")
    if cut is not None and (natural is None or cut < natural):
        return cut, "length"
    assert natural is not None
    return natural, "stop"


def embedding(text: str, dims: int = 8) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round((digest[i % len(digest)] - 127.5) / 127.5, 6) for i in range(dims)]


_SCHEMA_SAMPLES: dict[str, Any] = {
    "string": "sim",
    "integer": 1,
    "number": 1,
    "boolean": True,
    "array": [],
    "object": {},
}


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


ToolCall = tuple[str, str, str]  # (id, name, JSON arguments)


def tool_calls(body: dict[str, Any]) -> list[ToolCall]:
    """The tool calls the sim answers a chat request with (none: it answers in words). Deterministic, and a
    tool loop ends:

    - no tools, or `tool_choice: none`: words.
    - a named `tool_choice`: that tool, every turn (as OpenAI forces it).
    - the last message a tool's result: words under `auto`; under `required` the next offered tool not called
      since the last user message (the first again once each was), so an output tool listed last ends a loop.
    - otherwise each offered tool whose name is in the last user message's text, in the order offered (one
      when `parallel_tool_calls` is false), or the first offered tool when the text names none.

    Arguments hold a sample value per required parameter (each property when none is required: an enum's first
    value, else one per JSON type)."""
    tools, choice, messages = body.get("tools"), body.get("tool_choice"), body.get("messages")
    if not isinstance(tools, list) or not tools or choice == "none" or not isinstance(messages, list):
        return []
    functions = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    functions = [f for f in functions if isinstance(f.get("name"), str) and f["name"]]
    if not functions:
        return []
    named = _obj(_obj(choice).get("function")).get("name")
    if named is not None:
        chosen = [f for f in functions if f["name"] == named][:1] or functions[:1]
    elif messages and _obj(messages[-1]).get("role") == "tool":
        if choice != "required":
            return []
        called = _called_since_user(messages)
        chosen = [next((f for f in functions if f["name"] not in called), functions[0])]
    else:
        text = _last_user_text(messages)
        chosen = [f for f in functions if re.search(rf"\b{re.escape(f['name'])}\b", text)] or functions[:1]
        if body.get("parallel_tool_calls") is False:
            chosen = chosen[:1]
    history = json.dumps(messages)
    return [_call(f, i, history) for i, f in enumerate(chosen)]


def _call(function: dict[str, Any], index: int, history: str) -> ToolCall:
    schema = _obj(function.get("parameters"))
    props = _obj(schema.get("properties"))
    required = [p for p in schema.get("required") or () if p in props] or list(props)
    args = {}
    for name in required:
        prop = _obj(props[name])
        enum = prop.get("enum")
        args[name] = (
            enum[0] if isinstance(enum, list) and enum else _SCHEMA_SAMPLES.get(str(prop.get("type")), "sim")
        )
    arguments = json.dumps(args)
    digest = hashlib.sha256(f"{function['name']}{arguments}{index}{history}".encode()).hexdigest()
    return "call_" + digest[:24], function["name"], arguments


def _last_user_text(messages: list[Any]) -> str:
    last: Any = next((m for m in reversed(messages) if _obj(m).get("role") == "user"), {})
    content = last.get("content")
    if isinstance(content, list):  # parts: their text
        return " ".join(str(_obj(p).get("text", "")) for p in content)
    return content if isinstance(content, str) else ""


def _called_since_user(messages: list[Any]) -> set[str]:
    called: set[str] = set()
    for message in reversed(messages):
        m = _obj(message)
        if m.get("role") == "user":
            break
        for call in m.get("tool_calls") or ():
            called.add(str(_obj(_obj(call).get("function")).get("name")))
    return called


def relevance(query: str, document: str) -> float:
    """A reranker's score, deterministic: the share of the two texts' lower-cased words they have in common
    (Jaccard), so a document that repeats the query's words ranks first."""
    q, d = set(query.lower().split()), set(document.lower().split())
    return round(len(q & d) / len(q | d), 6) if q | d else 0.0


def schema_sample(schema: Any, depth: int = 0) -> Any:
    """A value valid against a simple JSON schema (object, array, enum, the scalar types), as an engine with
    structured output answers a `response_format`: required properties (every one when none is)."""
    node = _obj(schema)
    enum = node.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = node.get("type")
    if kind == "object" or (kind is None and "properties" in node):
        props = _obj(node.get("properties"))
        required = [p for p in node.get("required") or () if p in props] or list(props)
        return {name: schema_sample(props[name], depth + 1) for name in required} if depth < 8 else {}
    if kind == "array":
        return []
    return _SCHEMA_SAMPLES.get(str(kind), "sim")


def response_schema(body: dict[str, Any]) -> Any | None:
    """The schema a request's response_format asks for ({} for json_object), or None when it asks none."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {}
    if fmt.get("type") == "json_schema":
        return _obj(_obj(fmt.get("json_schema")).get("schema"))
    return None


def canned_answer(answers: tuple[tuple[str, str], ...], body: dict[str, Any]) -> str | None:
    """The first configured answer whose key is in the last message's text (`*` matches any)."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, dict) else None
    text = content if isinstance(content, str) else ""
    return next((answer for key, answer in answers if key == "*" or key in text), None)


def parse_answers(raw: str) -> tuple[tuple[str, str], ...]:
    """`key=answer;key=answer` (the sim's --answers): a request whose last message contains key gets
    answer."""
    out = []
    for item in raw.split(";"):
        if not item.strip():
            continue
        key, sep, answer = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--answers item {item!r} is not key=answer")
        out.append((key, answer))
    return tuple(out)


@dataclass
class ErrorPacer:
    """Fails `rate` of the requests, spread evenly and deterministically (1: every one, 0: none)."""

    rate: float
    seen: int = 0

    def fail(self) -> bool:
        self.seen += 1
        return math.floor(self.seen * self.rate) > math.floor((self.seen - 1) * self.rate)


def continuation_refusal(body: dict[str, Any]) -> str | None:
    """Why vLLM would refuse a chat's `continue_final_message` (continue the final assistant message rather than
    answer anew), else None: it takes `add_generation_prompt: false` with it, and a final message to continue."""
    if body.get("continue_final_message") is not True:
        return None
    if body.get("add_generation_prompt", True) is not False:
        return "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if _obj(last).get("role") != "assistant":
        return "continue_final_message is set but the final message is not the assistant's."
    return None
