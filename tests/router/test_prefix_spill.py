"""The prefix policy's combination with load: short matches count as none, a hot prefix whose holders are all
past the load bound is replicated to one deliberate replica, and a prompt no engine holds is not hashed whole."""

from __future__ import annotations

import random

from hypothesis import given, strategies as st
from llmgw_router.decisions.prefix import KvEvent, PrefixKey
from llmgw_router.decisions.prefix_spill import prefix_scores, spill_key
from llmgw_router.decisions.scheduler import Candidate, RequestInfo, schedule
from llmgw_router.fleet.table import LiveEndpoint
from llmgw_router.routing.prefix_routing import PrefixRouting

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.snapshot import Endpoint

POLICY = RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"prefix": 4, "inflight": 1}})
LEAST_INFLIGHT = RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"inflight": 1}})


def _key(head: str) -> PrefixKey:
    return PrefixKey((1, 2, 3), head + "\nuser: q", head + "\n")


def test_a_short_match_counts_as_none_and_load_decides() -> None:
    # 15% of the prompt cached on `a` is worth less than a queue: without min_share, 4 * 0.15 + 1/2 beats 1/1
    cands = [Candidate("a", inflight=1, prefix=0.15, prefix_source="precise"), Candidate("b", prefix=0.0)]
    d = schedule(cands, POLICY, RequestInfo(), random.Random(1))
    assert d.endpoint == "b", d.rationale()
    assert all(s.scores["prefix"] == 0.0 for s in d.scores)


@given(st.lists(st.integers(0, 12), min_size=2, max_size=8), st.integers(0, 1000))
def test_with_no_prefix_in_common_the_policy_picks_as_least_inflight_does(
    loads: list[int], seed: int
) -> None:
    def cands() -> list[Candidate]:
        return [
            Candidate(f"r{i}", inflight=n, prefix=0.0, prefix_source="precise") for i, n in enumerate(loads)
        ]

    least = min(loads)
    for policy in (POLICY, LEAST_INFLIGHT):
        chosen = schedule(cands(), policy, RequestInfo(prefix=_key(f"h{seed}")), random.Random(seed)).endpoint
        assert chosen is not None and loads[int(chosen[1:])] == least


def test_a_hot_prefix_spills_to_the_same_replica_whatever_the_others_loads() -> None:
    """The holder `a` is past its bound; each request of the group must land on one deliberate second replica,
    not on whichever is least busy (which would copy the prefix everywhere, evicting other groups)."""
    key = _key("system: the hot group's prompt")
    chosen = set()
    for loads in ([1, 2, 3], [3, 2, 1], [2, 3, 1], [1, 3, 2]):
        cands = [Candidate("a", inflight=12, prefix=0.99, prefix_source="precise")]
        cands += [
            Candidate(n, inflight=x, prefix=0.0, prefix_source="precise")
            for n, x in zip("bcd", loads, strict=True)
        ]
        d = schedule(cands, POLICY, RequestInfo(prefix=key), random.Random(7))
        assert d.endpoint != "a" and f"{d.endpoint}:spill" in d.rationale(), d.rationale()
        chosen.add(d.endpoint)
    assert len(chosen) == 1, chosen


def test_the_spill_replica_then_holds_the_prefix_and_is_preferred_while_within_its_bound() -> None:
    key = _key("system: the hot group's prompt")
    cands = [Candidate("a", inflight=12, prefix=0.99)] + [Candidate(n, inflight=2) for n in "bcd"]
    first = schedule(cands, POLICY, RequestInfo(prefix=key), random.Random(1)).endpoint
    # it has stored the prefix now, and another replica is idler: the second holder still wins
    cands = [Candidate("a", inflight=12, prefix=0.99)]
    cands += [
        Candidate(n, inflight=3 if n == first else 0, prefix=0.99 if n == first else 0.0) for n in "bcd"
    ]
    d = schedule(cands, POLICY, RequestInfo(prefix=key), random.Random(1))
    assert d.endpoint == first and "spill" not in d.rationale()


@given(
    st.lists(st.tuples(st.integers(0, 20), st.sampled_from([0.0, 0.1, 0.5, 1.0])), min_size=1, max_size=8),
    st.text(max_size=20),
)
def test_the_prefix_never_draws_a_request_past_the_load_bound(
    cands_spec: list[tuple[int, float]], head: str
) -> None:
    cands = [Candidate(f"r{i}", inflight=n, prefix=p) for i, (n, p) in enumerate(cands_spec)]
    total = sum(c.inflight for c in cands) + 1
    ceiling = -(-int(1.5 * total * 2) // (2 * len(cands)))  # ceil(1.5 * total / n), exact for halves
    over = frozenset(c.id for c in cands if c.inflight + 1 > ceiling)
    scores, spill = prefix_scores(cands, over, spill_key(head), 0.2)
    assert all(scores[c] == 0.0 for c in over)
    assert spill is None or spill not in over
    assert all(v == 0.0 or v >= 0.2 for v in scores.values())


def _ep(replica: str) -> LiveEndpoint:
    spec = Endpoint(
        replica_id=replica,
        model="m",
        engine="sim",
        base_url="http://127.0.0.1:1",
        kv_events="http://127.0.0.1:2/llmgw/kv-events",
        kv_block_size=16,
    )
    return LiveEndpoint(spec, "http://127.0.0.1:1/v1", None, None, 0.0)


def test_a_prompt_no_engine_holds_is_hashed_one_block_deep() -> None:
    """Low reuse: the first block's hash says no engine holds any of the prompt, so the rest is not hashed
    (the cost a prefix policy would otherwise add to every request with nothing to gain)."""
    pr, eps = PrefixRouting(), [_ep("a"), _ep("b")]
    body = {"messages": [{"role": "user", "content": " ".join(f"u{i}" for i in range(300))}]}
    key = pr.key(body, POLICY, "p")
    assert key is not None
    for ep in eps:
        pr.events.apply(ep.id, [KvEvent("stored", (12345,))], now=0.0)
    cands = [Candidate(ep.id) for ep in eps]
    pr.annotate(cands, eps, key, POLICY, "p", now=1.0)
    pr.placed(eps[0], key, POLICY, "p", now=1.0)
    assert [(c.prefix, c.prefix_source) for c in cands] == [(0.0, "precise"), (0.0, "precise")]
    assert key._engine == {}  # the whole-prompt chain was never computed
    assert not pr.events.fresh("a", now=1.0 + 11.0)  # it still expects the engine to report the new blocks
    full = key.engine_hashes(16, "0", None, 256)
    assert full and key.first_engine_hash(16, "0", None) == full[0]


@given(st.lists(st.sampled_from(["a", "b", "c", "dd"]), max_size=70), st.integers(1, 20))
def test_the_first_block_hash_is_the_whole_chains_first(words: list[str], block: int) -> None:
    key = PrefixKey((), " ".join(words))
    full = key.engine_hashes(block, "0", "salt", 256)
    assert key.first_engine_hash(block, "0", "salt") == (full[0] if full else None)


def test_a_full_holder_within_its_bound_is_waited_for_rather_than_prefilling_elsewhere() -> None:
    """With slots known (as deployed), the full filter dropped every busy holder, and at saturation the
    policy became least-inflight (the benchmark's prefix-slots row); a holder within the load bound is now
    kept, as a session's target is, and the decision says so, for the forwarder to send it there when full."""
    cands = [Candidate("a", inflight=8, slots=8, prefix=0.99, prefix_source="precise")]
    cands += [
        Candidate(n, inflight=x, slots=8, prefix_source="precise") for n, x in (("b", 7), ("c", 8), ("d", 8))
    ]
    d = schedule(cands, POLICY, RequestInfo(prefix=_key("system: g")), random.Random(1))
    assert d.endpoint == "a" and d.prefix_holder and d.dropped["full"] == 2, d.rationale()
    # past its bound (1.5 x the mean, 17 with this request, being larger than 1.5 x its slots) it is full again
    cands[0].inflight = 20
    d = schedule(cands, POLICY, RequestInfo(prefix=_key("system: g")), random.Random(1))
    assert d.endpoint == "b" and not d.prefix_holder and d.dropped["full"] == 3, d.rationale()


def test_the_router_forwards_to_a_full_holder_instead_of_holding_the_request_or_prefilling_elsewhere() -> (
    None
):
    from llmgw_router.path.service import Router, RouterOptions

    from llmgw.core.snapshot import RouterSnapshot

    eps = [
        {"replica_id": r, "model": "m", "engine": "vllm", "base_url": f"http://127.0.0.1:{9 + i}", "slots": 1}
        for i, r in enumerate(("a", "b"))
    ]
    policy = {"picker": "max_score", "weights": {"prefix": 4, "inflight": 1}}
    raw = {"revision": "r", "models": {"m": {"context_length": 4096}}, "router": {"default_policy": "p"}}
    router = Router(RouterOptions())
    router.apply_snapshot(RouterSnapshot.model_validate({**raw, "policies": {"p": policy}, "endpoints": eps}))
    table, fwd = router.table, router.forwarding
    assert table is not None
    body = {"messages": [{"role": "system", "content": "shared " * 200}, {"role": "user", "content": "q"}]}
    key = fwd.prefix.key(body, table.policy_for("m"), "p1")
    assert key is not None
    first = fwd.claim(table, "m", RequestInfo(prefix=key, project="p1"), need_room=True)
    assert first is not None
    holder = first[0]
    assert holder.inflight == 1  # full: one slot
    second = fwd.claim(table, "m", RequestInfo(prefix=key, project="p1"), need_room=True)
    assert second is not None, "held back although its prefix holder was within the load bound"
    assert second[0] is holder and second[1].prefix_holder, second[1].rationale()


def test_canary_and_adapter_steering_keep_the_prompts_prefix_and_project() -> None:
    """Steering narrows a request's endpoints; it rebuilt the request's info from three of its five fields,
    so a canary model or a LoRA request lost its prefix score without a word."""
    from llmgw_router.path.lora import Adapters
    from llmgw_router.path.service import Router, RouterOptions
    from llmgw_router.path.steering import Steering

    from llmgw.core.snapshot import PublishedAdapter, RouterSnapshot

    eps = [
        {"replica_id": r, "model": "m", "engine": "vllm", "base_url": f"http://127.0.0.1:{9 + i}"}
        for i, r in enumerate(("a", "b"))
    ]
    raw = {"revision": "r", "models": {"m": {"context_length": 4096}}, "endpoints": eps}
    router = Router(RouterOptions())
    router.apply_snapshot(RouterSnapshot.model_validate(raw))
    table = router.table
    assert table is not None
    info = RequestInfo(session_key="s", rr_counter=3, prefix=_key("system: g"), project="p1")
    specs = {"m": [ep.spec for ep in table.endpoints["m"]]}
    steered = Steering(specs, frozenset(), 1.0).info(table, ("m",), {}, info, 0.0)
    assert (steered.prefix, steered.project, steered.session_key) == (info.prefix, "p1", "s")
    adapted, _ = Adapters().steer(table, "m", "lora-x", PublishedAdapter(base="m", path="/x"), info)
    assert (adapted.prefix, adapted.project, adapted.rr_counter) == (info.prefix, "p1", 3)
