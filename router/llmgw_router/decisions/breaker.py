"""A circuit breaker per endpoint, as values: the caller holds a `BreakerState` and a clock.

Closed until `failure_threshold` consecutive failures; then open for a backoff that doubles on every failed
probe up to `max_backoff`; when the backoff has passed, one request is let through as a probe (half-open).
Its success closes the breaker, its failure opens it again for longer. A threshold of 1 behaves as a
cool-down. Scrape failures are not fed here: an engine can serve while only its metrics are down.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["BreakerPolicy", "BreakerState", "allow", "on_failure", "on_success"]

BreakerMode = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class BreakerPolicy:
    failure_threshold: int = 3
    base_backoff: float = 1.0
    max_backoff: float = 60.0
    # A probe that never reports back (its request was cancelled) must not hold the breaker half-open forever.
    probe_timeout: float = 30.0


@dataclass(frozen=True)
class BreakerState:
    mode: BreakerMode = "closed"
    failures: int = 0  # consecutive
    opened_until: float = 0.0
    backoff: float = 0.0  # the last open period, doubled on a failed probe
    probe_started: float | None = None

    def is_open(self, now: float) -> bool:
        """True when a request now would be refused (open and not yet due, or a probe already out)."""
        if self.mode == "open":
            return now < self.opened_until
        return self.mode == "half_open" and self.probe_started is not None


def allow(state: BreakerState, now: float, policy: BreakerPolicy) -> tuple[bool, BreakerState]:
    """May a request go to this endpoint now? Returns the answer and the state after asking."""
    if state.mode == "closed":
        return True, state
    if state.mode == "open":
        if now < state.opened_until:
            return False, state
        return True, replace(state, mode="half_open", probe_started=now)
    # half-open: one probe at a time; a lost probe is replaced after probe_timeout
    if state.probe_started is None or now - state.probe_started >= policy.probe_timeout:
        return True, replace(state, probe_started=now)
    return False, state


_CLOSED = BreakerState()


def on_success(state: BreakerState) -> BreakerState:
    # Nearly every request ends on a closed breaker with no failures: keep that state without comparing
    # (or building) a new one.
    if state is _CLOSED or (state.mode == "closed" and state.failures == 0):
        return state
    return _CLOSED


def on_failure(state: BreakerState, now: float, policy: BreakerPolicy) -> BreakerState:
    failures = state.failures + 1
    if state.mode == "half_open":
        backoff = min(max(state.backoff * 2, policy.base_backoff), policy.max_backoff)
        return BreakerState("open", failures, now + backoff, backoff, None)
    if state.mode == "closed" and failures < policy.failure_threshold:
        return replace(state, failures=failures)
    if state.mode == "open":  # a request already in flight when it opened: keep the current period
        return replace(state, failures=failures)
    backoff = policy.base_backoff
    return BreakerState("open", failures, now + backoff, backoff, None)
