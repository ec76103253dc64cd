"""llmgw.core.api.notify's pure decisions: what is retried and when, what is final, what is news once."""

from __future__ import annotations

from hypothesis import given, strategies as st

from llmgw.core.api import notify
from llmgw.core.config.models import NotificationRetry, NotificationSpec

SPEC = NotificationSpec(
    url="https://hooks.example.com/x",
    events=["revision_refused"],
    retry=NotificationRetry(attempts=4, backoff="1s", max_backoff="5s"),
)


def test_2xx_is_delivered_5xx_408_429_and_no_answer_are_retried_other_4xx_are_final() -> None:
    assert notify.classify(notify.Attempt(204)) == "delivered"
    for status in (500, 502, 503, 408, 429):
        assert notify.classify(notify.Attempt(status)) == "retry"
    assert notify.classify(notify.Attempt(None, "ConnectionRefusedError")) == "retry"
    for status in (301, 400, 401, 404, 410, 422):
        assert notify.classify(notify.Attempt(status)) == "final"


def test_retries_until_the_attempts_are_used_then_dead() -> None:
    verdicts = [notify.after_attempt(SPEC, n, notify.Attempt(503), 100.0, 0.5) for n in (1, 2, 3, 4)]
    assert all(isinstance(v, notify.RetryAt) for v in verdicts[:3])
    assert isinstance(verdicts[3], notify.Dead) and "gave up after 4" in verdicts[3].error
    final = notify.after_attempt(SPEC, 1, notify.Attempt(404), 100.0, 0.5)
    assert isinstance(final, notify.Dead) and "HTTP 404" in final.error


@given(failures=st.integers(1, 30), draw=st.floats(0, 1, exclude_max=True))
def test_backoff_doubles_is_capped_and_jitters_between_half_and_all(failures: int, draw: float) -> None:
    full = min(5.0, 1.0 * 2 ** (failures - 1))
    wait = notify.backoff_s(SPEC, failures, draw)
    assert full / 2 <= wait <= full


def test_budget_thresholds_carry_one_mark_per_tenant_threshold_and_window() -> None:
    def reading(spent: float, start: float = 0.0) -> notify.BudgetReading:
        return notify.BudgetReading("project", "web", 10.0, spent, start, start + 86400)

    assert notify.budget_events(reading(7.9), 5.0) == []
    [at80] = notify.budget_events(reading(8.0), 5.0)
    assert at80.kind == "budget_80"
    kinds = [e.kind for e in notify.budget_events(reading(12.0), 5.0)]
    assert kinds == ["budget_80", "budget_100"]
    marks = {notify.dedupe_mark(e) for e in notify.budget_events(reading(12.0), 5.0)}
    assert notify.dedupe_mark(at80) in marks  # the same window: the same news, said once
    later = notify.budget_events(reading(8.0, start=86400), 86405.0)
    assert notify.dedupe_mark(later[0]) not in marks  # a new window is news again
    zero = notify.BudgetReading("org", "acme", 0.0, 0.0, 0.0, 1.0)
    assert [e.kind for e in notify.budget_events(zero, 0.5)] == ["budget_80", "budget_100"]


def test_a_crash_loop_is_one_message_per_model_an_hour() -> None:
    def failed(replica: str, at: float) -> notify.NotifyEvent:
        return notify.NotifyEvent("replica_failed", replica, "engine exited", at, fields={"model": "m"})

    assert notify.dedupe_mark(failed("m-1", 10.0)) == notify.dedupe_mark(failed("m-2", 3000.0))
    assert notify.dedupe_mark(failed("m-3", 3700.0)) != notify.dedupe_mark(failed("m-1", 10.0))
    assert notify.dedupe_mark(notify.NotifyEvent("revision_refused", "abc", "x", 1.0)) is None


def test_the_signature_binds_the_timestamp_and_the_body() -> None:
    sig = notify.signature(b"s", 1000, b"{}")
    assert notify.verify(b"s", "1000", b"{}", sig, 1100.0, 300)
    assert not notify.verify(b"s", "1001", b"{}", sig, 1100.0, 300)  # another timestamp
    assert not notify.verify(b"s", "1000", b"{}", sig, 2000.0, 300)  # replayed too late
    assert not notify.verify(b"s", "1000", b"[]", sig, 1100.0, 300)
