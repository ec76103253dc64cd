"""The router's block hashes are vLLM's own: vLLM 0.32 (the CPU build `make vllm` prepared) hashes token ids
with its `hash_block_tokens`, the algorithm the agent names (`--prefix-caching-hash-algo`) and the seed it sets
(PYTHONHASHSEED), and the router's `vllm_block_hashes` must give the integers its KV events carry. Salted as
the router salts every vLLM request (`cache_salt`), and not, at two seeds. The events of a running vLLM are asserted in
test_vllm_real*.py; this is the hashing alone, in one process start."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from llmgw_agent.engines import VLLM_PREFIX_HASH_ALGO
from llmgw_router.decisions.prefix import salt_keys, vllm_block_hashes

pytestmark = pytest.mark.vllm

# Run by vLLM's python: each case's block integers as vLLM computes and publishes them.
VLLM_HASHES = """
import json, os, sys, types
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as kv
algo, cases = sys.argv[1], json.loads(sys.stdin.read())
fn = get_hash_fn_by_name(algo)
out = []
for seed, ids, block, salt in cases:
    os.environ["PYTHONHASHSEED"] = seed  # as the agent starts vLLM; NONE_HASH is derived from it
    kv.init_none_hash(fn)
    parent, hashes = None, []
    for i in range(len(ids) // block):
        # A text request as vLLM's scheduler sees it: the fields its extra keys are made of (no LoRA, no images)
        request = types.SimpleNamespace(lora_request=None, cache_salt=salt, prompt_embeds=None, mm_features=[])
        extra, _ = kv.generate_block_hash_extra_keys(request, i * block, (i + 1) * block, 0)
        parent = kv.hash_block_tokens(fn, parent, ids[i * block : (i + 1) * block], extra)
        hashes.append(kv.maybe_convert_block_hash(parent))
    out.append(hashes)
print(json.dumps(out))
"""

PROMPTS = [
    (list(range(1, 33)), 16, None),
    (list(range(1, 33)), 16, "salt-a"),
    ([7, 7, 7] * 90, 128, "a3f9c0de"),  # the CPU block size; a 2-block prompt with a partial tail
]
CASES = [(seed, ids, block, salt) for seed in ("0", "1234") for ids, block, salt in PROMPTS]


def test_vllm_hashes_the_blocks_as_the_router_recomputes_them(vllm_python: str) -> None:
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    out = subprocess.run(
        [vllm_python, "-c", VLLM_HASHES, VLLM_PREFIX_HASH_ALGO],
        input=json.dumps(CASES),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    ours = [vllm_block_hashes(ids, block, seed, salt) for seed, ids, block, salt in CASES]
    assert theirs == ours
    assert [len(h) for h in ours] == [2] * 6 and salt_keys(None) is None
    assert len({h for hashes in ours for h in hashes}) == 12  # each seed and salt its own hashes
