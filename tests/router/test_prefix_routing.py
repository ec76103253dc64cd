"""The request-path glue: which index answers for an endpoint, and what a placed request leaves behind."""

from __future__ import annotations

import logging

import pytest
from llmgw_router.decisions.fields import SALTED_ENGINES, cache_salt
from llmgw_router.decisions.prefix import EventIndex, KvEvent
from llmgw_router.decisions.scheduler import Candidate
from llmgw_router.fleet.table import LiveEndpoint
from llmgw_router.routing.prefix_routing import PrefixRouting

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.snapshot import Endpoint

POLICY = RoutingPolicySpec.model_validate(
    {"weights": {"prefix": 1}, "prefix": {"events_stale_after": "5s", "block_chars": 8}}
)
BODY = {"messages": [{"role": "system", "content": " ".join(["w"] * 64)}, {"role": "user", "content": "hi"}]}


def _ep(replica: str, engine: str = "sim", events: bool = True) -> LiveEndpoint:
    spec = Endpoint(
        replica_id=replica,
        model="m",
        engine=engine,
        base_url="http://127.0.0.1:1",
        kv_events="http://127.0.0.1:2/llmgw/kv-events" if events else None,
        kv_block_size=16,
    )
    return LiveEndpoint(spec, "http://127.0.0.1:1/v1", None, None, 0.0)


def _annotate(pr: PrefixRouting, eps: list[LiveEndpoint], now: float, project: str = "p") -> list[Candidate]:
    key = pr.key(BODY, POLICY, project)
    assert key is not None
    cands = [Candidate(ep.id) for ep in eps]
    pr.annotate(cands, eps, key, POLICY, project, now)
    return cands


def test_fresh_events_answer_then_the_approximate_index_once_they_stop() -> None:
    pr, a = PrefixRouting(), _ep("a")
    key = pr.key(BODY, POLICY, "p")
    assert key is not None
    hashes = pr._engine_hashes(a, key, POLICY, "p")
    assert hashes  # 64 words of system prompt: 4 full blocks
    pr.events.apply("a", [KvEvent("stored", hashes)], now=0.0)
    (c,) = _annotate(pr, [a], now=1.0)
    assert (c.prefix, c.prefix_source) == (1.0, "precise")
    # a request with blocks the engine lacks goes there, and no event follows it
    other = {"messages": [{"role": "user", "content": " ".join(["z"] * 40)}]}
    other_key = pr.key(other, POLICY, "p")
    assert other_key is not None
    pr.placed(a, other_key, POLICY, "p", now=2.0)
    (c,) = _annotate(pr, [a], now=6.9)
    assert c.prefix_source == "precise"
    (c,) = _annotate(pr, [a], now=7.1)
    assert c.prefix_source == "approx" and c.prefix == 0.0  # this router never sent BODY there
    pr.placed(a, key, POLICY, "p", now=7.2)
    (c,) = _annotate(pr, [a], now=7.3)
    assert (c.prefix, c.prefix_source) == (1.0, "approx")


def test_engines_the_router_cannot_tokenize_for_are_scored_approximately() -> None:
    pr, v = PrefixRouting(), _ep("v", engine="vllm")
    key = pr.key(BODY, POLICY, "p")
    assert key is not None
    pr.placed(v, key, POLICY, "p", now=0.0)
    (c,) = _annotate(pr, [v], now=0.1)
    assert (c.prefix, c.prefix_source) == (1.0, "approx")


def test_one_projects_prompts_never_attract_anothers() -> None:
    pr, a = PrefixRouting(), _ep("a", events=False)
    key = pr.key(BODY, POLICY, "p1")
    assert key is not None
    pr.placed(a, key, POLICY, "p1", now=0.0)
    assert _annotate(pr, [a], now=0.1, project="p1")[0].prefix == 1.0
    assert _annotate(pr, [a], now=0.1, project="p2")[0].prefix == 0.0


def test_no_prefix_weight_no_key() -> None:
    assert PrefixRouting().key(BODY, RoutingPolicySpec(), "p") is None


def test_a_stream_going_silent_is_said_once_and_its_return_once(caplog: pytest.LogCaptureFixture) -> None:
    pr, a = PrefixRouting(), _ep("a")
    key = pr.key(BODY, POLICY, "p")
    assert key is not None
    pr.events.apply("a", [KvEvent("stored", ())], now=0.0)
    pr.placed(a, key, POLICY, "p", now=1.0)  # new blocks, and no event follows
    with caplog.at_level(logging.WARNING, logger="llmgw_router.routing.prefix_routing"):
        for t in (7.0, 8.0, 9.0):
            _annotate(pr, [a], now=t)
        pr.events.apply("a", [KvEvent("stored", ())], now=9.5)
        for t in (10.0, 11.0):
            _annotate(pr, [a], now=t)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "approximate index" in said[0] and "KV events again" in said[1], said


def test_an_engine_is_hashed_in_the_blocks_its_events_say() -> None:
    """vLLM's CPU build stores blocks of 128 tokens where the snapshot says 16 (its GPU builds'): the router
    hashes a prompt in the block size the engine's own BlockStored events carry."""
    pr, a = PrefixRouting(), _ep("a")
    body = {
        "messages": [{"role": "system", "content": " ".join(["w"] * 300)}, {"role": "user", "content": "hi"}]
    }
    key = pr.key(body, POLICY, "p")
    assert key is not None
    by_snapshot = pr._engine_hashes(a, key, POLICY, "p")
    assert by_snapshot is not None and len(by_snapshot) == 18  # 300 words and the roles, in blocks of 16
    salt = cache_salt(a.spec.api_key, "p") if a.spec.engine in SALTED_ENGINES else None
    stored = key.engine_hashes(128, POLICY.prefix.hash_seed, salt, POLICY.prefix.max_blocks)
    assert stored is not None and len(stored) == 2
    pr.events.apply("a", [KvEvent("stored", stored, block_size=128)], now=0.0)
    assert pr.events.block_size("a") == 128
    assert pr._engine_hashes(a, key, POLICY, "p") == stored
    key = pr.key(body, POLICY, "p")  # a new request, hashed afresh
    assert key is not None
    (c,) = _annotate_key(pr, [a], key, now=1.0)
    assert (c.prefix, c.prefix_source) == (1.0, "precise")


def _annotate_key(pr: PrefixRouting, eps: list[LiveEndpoint], key: object, now: float) -> list[Candidate]:
    cands = [Candidate(ep.id) for ep in eps]
    pr.annotate(cands, eps, key, POLICY, "p", now)  # type: ignore[arg-type]
    return cands


def test_a_prompt_sent_to_compute_its_blocks_draws_the_same_prefix_before_its_events_come() -> None:
    """vLLM says a prefill's blocks a step or more after it ran; a second request with the same system prompt
    meanwhile (an agent's parallel calls) found no replica holding it and went anywhere. The blocks a request
    was sent to compute count as held there until their events arrive, or until `events_stale_after` without
    them."""
    pr, a, b = PrefixRouting(), _ep("a"), _ep("b")
    for ep in (a, b):
        pr.events.apply(ep.id, [KvEvent("stored", ())], now=0.0)  # both streams heard, neither holds BODY
    key = pr.key(BODY, POLICY, "p")
    assert key is not None
    assert [c.prefix for c in _annotate(pr, [a, b], now=1.0)] == [0.0, 0.0]
    pr.placed(a, key, POLICY, "p", now=1.0)  # the first request goes to a: no event yet
    ca, cb = _annotate(pr, [a, b], now=1.1)
    # Its first block of 4 (a prompt no engine held is not hashed whole): enough to draw the next request.
    assert (ca.prefix, ca.prefix_source, cb.prefix) == (0.25, "precise", 0.0)
    hashes = pr._engine_hashes(a, key, POLICY, "p")
    pr.events.apply("a", [KvEvent("stored", hashes)], now=1.2)  # the events come: held for good
    assert [c.prefix for c in _annotate(pr, [a, b], now=9.0)] == [1.0, 0.0]
    # Sent to b, whose events never say it: held there only until events_stale_after (5 s) has passed.
    pr.placed(b, key, POLICY, "p", now=10.0)
    assert _annotate(pr, [a, b], now=14.9)[1].prefix > 0
    pr.events.apply("b", [KvEvent("stored", ())], now=14.9)  # other events from b keep its stream fresh
    assert _annotate(pr, [a, b], now=15.1)[1].prefix == 0.0


def test_pending_blocks_go_when_the_engine_says_it_removed_them() -> None:
    index = EventIndex(100, stale_after=10)
    index.apply("a", [KvEvent("stored", ())], 0.0)
    index.expect("a", (1, 2), 0.0)
    assert index.match("a", [1, 2, 3], now=1.0) == 2
    assert index.match("a", [1, 2, 3]) == 0  # without `now`: what the events said only
    index.apply("a", [KvEvent("removed", (2,))], 2.0)
    assert index.match("a", [1, 2, 3], now=3.0) == 1
    index.apply("a", [KvEvent("cleared")], 4.0)
    assert index.match("a", [1, 2, 3], now=5.0) == 0
