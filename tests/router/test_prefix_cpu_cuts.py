"""The low-reuse CPU cuts (docs/routing.md, the eighth session) change no answer: the approximate hashes of an
ASCII prompt, encoded once, equal the per-character definition; integer block hashes pass through event
parsing as they are while bytes and booleans are still read as before; and the per-call memo of the first
block's hash scores each endpoint as its own engine, block size and key say."""

from __future__ import annotations

import hashlib

from hypothesis import given, strategies as st
from llmgw_router.decisions.prefix import (
    KvEvent,
    external_hash,
    none_hash,
    parse_event_batch,
    text_block_hashes,
)
from llmgw_router.decisions.scheduler import Candidate
from llmgw_router.fleet.table import LiveEndpoint
from llmgw_router.routing.prefix_routing import PrefixRouting

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.snapshot import Endpoint

POLICY = RoutingPolicySpec.model_validate({"weights": {"prefix": 1}, "prefix": {"block_chars": 8}})


def _by_characters(text: str, block_chars: int, key: str, max_blocks: int) -> list[int]:
    """The approximate index's hashes as defined: each block_chars-character chunk, encoded, chained."""
    out, parent = [], hashlib.blake2b(key.encode(), digest_size=8, person=b"llmgw-prefix").digest()
    for i in range(min(len(text) // block_chars, max_blocks)):
        chunk = text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass")
        parent = hashlib.blake2b(parent + chunk, digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


@given(st.text(max_size=400), st.integers(1, 70), st.text(max_size=8), st.integers(1, 300))
def test_approximate_hashes_equal_the_per_character_definition(
    text: str, block_chars: int, key: str, max_blocks: int
) -> None:
    assert text_block_hashes(text, block_chars, key, max_blocks) == _by_characters(
        text, block_chars, key, max_blocks
    )


@given(st.text(alphabet=st.characters(max_codepoint=127), min_size=64, max_size=400), st.integers(1, 70))
def test_ascii_prompts_take_the_byte_path_with_the_same_hashes(text: str, block_chars: int) -> None:
    assert text.isascii()
    assert text_block_hashes(text, block_chars, "p", 256) == _by_characters(text, block_chars, "p", 256)


def test_event_hashes_integers_as_they_are_bytes_by_their_last_eight_and_booleans_dropped() -> None:
    digest = bytes(range(32))
    _, ints = parse_event_batch([0.0, [["BlockStored", [1, 2, 1 << 63], None, [], 16]]])
    _, mixed = parse_event_batch([0.0, [["BlockRemoved", [3, digest, True]]]])
    assert ints == [KvEvent("stored", (1, 2, 1 << 63))]
    assert mixed == [KvEvent("removed", (3, external_hash(digest)))]


def test_none_hash_is_memoised_per_seed_and_still_distinct_between_seeds() -> None:
    assert none_hash("0") is none_hash("0")
    assert none_hash("0") != none_hash("1")


def _ep(replica: str, block_size: int, api_key: str | None = None) -> LiveEndpoint:
    spec = Endpoint(
        replica_id=replica,
        model="m",
        engine="sim",
        base_url="http://127.0.0.1:1",
        kv_events="http://127.0.0.1:2/llmgw/kv-events",
        kv_block_size=block_size,
        api_key=api_key,
    )
    return LiveEndpoint(spec, "http://127.0.0.1:1/v1", None, None, 0.0)


def test_endpoints_that_hash_differently_are_each_matched_by_their_own_first_block() -> None:
    """Three endpoints: two alike, one with another block size. Each holds its own first block of the prompt;
    the memo shared within a request must not hand one's hash to another."""
    body = {"messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(64))}]}
    pr = PrefixRouting()
    eps = [_ep("a", 16), _ep("b", 16), _ep("c", 8)]
    key = pr.key(body, POLICY, "p")
    assert key is not None
    for ep in eps:
        hashes = pr._engine_hashes(ep, key, POLICY, "p")
        assert hashes
        pr.events.apply(ep.id, [KvEvent("stored", hashes)] if ep.id != "b" else [], 0.0)
    cands = [Candidate(ep.id) for ep in eps]
    pr.annotate(cands, eps, key, POLICY, "p", 1.0)
    assert [(c.prefix, c.prefix_source) for c in cands] == [
        (1.0, "precise"),
        (0.0, "precise"),
        (1.0, "precise"),
    ]
