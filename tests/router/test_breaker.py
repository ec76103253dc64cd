"""The breaker with a fake clock: consecutive failures open it, backoff doubles, one half-open probe."""

from __future__ import annotations

from llmgw_router.decisions.breaker import BreakerPolicy, BreakerState, allow, on_failure, on_success

POLICY = BreakerPolicy(failure_threshold=3, base_backoff=1.0, max_backoff=4.0, probe_timeout=30.0)


def fail(state: BreakerState, now: float, times: int = 1) -> BreakerState:
    for _ in range(times):
        state = on_failure(state, now, POLICY)
    return state


def test_stays_closed_below_the_threshold_and_a_success_resets_the_count() -> None:
    s = fail(BreakerState(), 0.0, 2)
    assert s.mode == "closed" and allow(s, 0.0, POLICY)[0]
    s = on_success(s)
    s = fail(s, 0.0, 2)
    assert s.mode == "closed"


def test_opens_after_consecutive_failures_then_probes_once() -> None:
    s = fail(BreakerState(), 10.0, 3)
    assert s.mode == "open" and s.is_open(10.5)
    assert allow(s, 10.5, POLICY) == (False, s)
    ok, s = allow(s, 11.0, POLICY)  # backoff (1 s) passed: one probe
    assert ok and s.mode == "half_open"
    ok2, s2 = allow(s, 11.1, POLICY)
    assert not ok2 and s2 == s  # a second request while the probe is out is refused
    assert on_success(s) == BreakerState()


def test_failed_probe_doubles_the_backoff_up_to_the_cap() -> None:
    s = fail(BreakerState(), 0.0, 3)
    now = 0.0
    backoffs = []
    for _ in range(4):
        now = s.opened_until
        ok, s = allow(s, now, POLICY)
        assert ok
        s = on_failure(s, now, POLICY)
        backoffs.append(s.backoff)
    assert backoffs == [2.0, 4.0, 4.0, 4.0]


def test_a_lost_probe_is_replaced_after_the_probe_timeout() -> None:
    s = fail(BreakerState(), 0.0, 3)
    _, s = allow(s, 1.0, POLICY)
    assert not allow(s, 20.0, POLICY)[0]
    assert allow(s, 31.0, POLICY)[0]


def test_threshold_one_is_a_cooldown() -> None:
    p = BreakerPolicy(failure_threshold=1, base_backoff=5.0)
    s = on_failure(BreakerState(), 0.0, p)
    assert s.is_open(4.9) and not s.is_open(5.0)
