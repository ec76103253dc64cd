"""A canary's gates (llmgw.core.evals.canary) and the router's split (llmgw_router.decisions.canary_route), pure."""

from __future__ import annotations

from llmgw_router.decisions.canary_route import steered_away
from llmgw_router.decisions.capabilities import refusal

from llmgw.core.config.specs.eval_spec import CanarySpec
from llmgw.core.evals.canary import Traffic, judge_canary
from llmgw.core.snapshot import CanaryRoute, Endpoint, PublishedModel


def spec(**gates: object) -> CanarySpec:
    return CanarySpec.model_validate({"weight": 20, "duration": "60s", "gates": gates})


def judge(s: CanarySpec, served: float, canary: Traffic, stable: Traffic, evals: dict | None = None):  # type: ignore[no-untyped-def, type-arg]
    return judge_canary(
        s, now=1000.0 + served, ready_since=1000.0, canary=canary, stable=stable, evals=evals or {}
    )


def test_nothing_is_judged_before_the_canary_is_ready() -> None:
    v = judge_canary(spec(), now=5.0, ready_since=None, canary=Traffic(100, 100), stable=Traffic(), evals={})
    assert v.state == "wait" and v.words == "the canary replica is not ready yet"


def test_errors_above_the_stable_rate_fail_at_once_once_min_requests_answered() -> None:
    s = spec(min_requests=20, max_error_rate=0.05)
    assert judge(s, 1, Traffic(19, 19), Traffic(100, 0)).state == "wait"  # too few to judge
    v = judge(s, 1, Traffic(20, 5), Traffic(100, 1))
    assert v.state == "fail"
    assert v.words == "error rate 25.0% over 20 requests against the stable replicas' 1.0% (allowed +5.0%)"
    # the same errors on the stable side too (the fleet's trouble, not the canary's): not the canary's fault
    assert (
        judge(
            s,
            61,
            Traffic(20, 5),
            Traffic(100, 24),
        ).state
        == "pass"
    )


def test_after_the_duration_with_enough_requests_it_passes_and_says_why() -> None:
    s = spec(min_requests=10, max_ttft_ratio=1.5)
    waiting = judge(s, 30, Traffic(50, 0, 100.0), Traffic(100, 0, 90.0))
    assert waiting.state == "wait" and waiting.words == "serving for 30s of 60s"
    few = judge(s, 61, Traffic(3, 0), Traffic(100, 0))
    assert few.state == "wait" and few.words == "3 of 10 requests answered"
    v = judge(s, 61, Traffic(50, 1, 120.0), Traffic(100, 1, 100.0))
    assert v.state == "pass"
    assert v.reasons == (
        "error rate 2.0% over 50 requests (stable 1.0%, allowed +5.0%)",
        "TTFT p99 120 ms against the stable 100 ms (x1.20, allowed x1.5)",
    )


def test_a_slow_canary_fails_the_ttft_gate_and_unknown_ttft_is_not_judged() -> None:
    s = spec(min_requests=0, max_ttft_ratio=1.5)
    slow = judge(s, 61, Traffic(10, 0, 400.0), Traffic(10, 0, 100.0))
    assert slow.state == "fail" and "x4.00, allowed x1.5" in slow.words
    unknown = judge(s, 61, Traffic(10, 0, None), Traffic(10, 0, 100.0))
    assert unknown.state == "pass" and "TTFT not judged: the canary's p99 is unknown" in unknown.reasons


def test_eval_suites_wait_fail_at_once_or_pass() -> None:
    s = spec(min_requests=0, evals=["a", "b"])
    assert judge(s, 61, Traffic(), Traffic(), {"a": True, "b": None}).words == "eval suite b running"
    failed = judge(s, 1, Traffic(), Traffic(), {"a": False, "b": None})
    assert failed.state == "fail" and failed.words == "eval suite a failed"
    passed = judge(s, 61, Traffic(), Traffic(), {"a": True, "b": True})
    assert passed.state == "pass" and passed.reasons[-2:] == ("eval suite a passed", "eval suite b passed")


def ep(
    rid: str, *, canary: bool = False, failed: tuple[str, ...] = (), verified: tuple[str, ...] = ()
) -> Endpoint:
    return Endpoint(
        replica_id=rid,
        model="m",
        engine="sim",
        base_url="http://x",
        canary=canary,
        failed=list(failed),
        verified=list(verified),
    )


MODELS = {"m": PublishedModel(context_length=10, canary=CanaryRoute(weight=20, header="x-canary"))}
EPS = {"m": [ep("s1"), ep("s2"), ep("c1", canary=True)]}


def away(
    draw: float,
    headers: dict[str, str] | None = None,
    failed: frozenset[str] = frozenset(),
    eps=EPS,
    needs=frozenset(),
):  # type: ignore[no-untyped-def]
    return steered_away(eps, MODELS, ("m",), headers=headers or {}, draw=draw, needs=needs, failed=failed)


def test_the_split_by_weight_and_by_header() -> None:
    assert away(0.10) == {"s1", "s2"}  # in the canary's 20%
    assert away(0.50) == {"c1"}
    assert away(0.99, {"x-canary": "1"}) == {"s1", "s2"}  # testers ask for it
    plain = {"m": PublishedModel(context_length=10)}
    assert (
        steered_away(EPS, plain, ("m",), headers={}, draw=0.0, needs=frozenset(), failed=frozenset()) == set()
    )


def test_a_group_with_nothing_usable_leaves_the_request_to_the_other() -> None:
    assert away(0.10, failed=frozenset({"c1"})) == set()  # the canary failed this request: stable serves
    assert away(0.50, failed=frozenset({"s1", "s2"})) == set()


def test_a_tools_request_goes_to_the_endpoints_whose_check_did_not_fail_it() -> None:
    # s1 failed the probe, s2 was never checked, s3 passed: unknown is not known to fail, so s2 serves
    # (the capability rule: docs/router.md, Capabilities; tests/router/test_capabilities_rule.py).
    eps = {"m": [ep("s1", failed=("tools",)), ep("s2"), ep("s3", verified=("tools",))]}
    assert away(0.5, eps=eps, needs=frozenset({"tools"})) == {"s1"}
    assert away(0.5, eps=eps) == set()  # a request without tools may go anywhere
    assert refusal(eps, MODELS, ("m",), frozenset({"tools"})) is None
    every = {"m": [ep("s1", failed=("tools",))]}
    refused = refusal(every, MODELS, ("m",), frozenset({"tools"}))
    assert refused is not None and refused.code == "capability_check_failed"
    assert refused.message.startswith(
        "No replica of `m` serves `tools`: the model check of its engine failed"
    )
    # No endpoint at all: the scheduler's 503, not a capability refusal.
    assert refusal({"m": []}, MODELS, ("m",), frozenset({"tools"})) is None
