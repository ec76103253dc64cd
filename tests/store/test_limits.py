"""The pure limit decision: each limit refuses at the right moment, naming the level, with retry-after."""

from __future__ import annotations

from llmgw.core.tenancy.limits import (
    MICROS,
    Allowed,
    Budget,
    Estimate,
    LevelLimits,
    LevelState,
    LimitRefused,
    Meter,
    Tenant,
    decide,
    format_reset,
    request_cost,
    to_micros,
    window_bounds,
)

ORG = Tenant("organization", "acme", LevelLimits(budget=Budget(500, 30 * 86400)))
TEAM = Tenant("team", "research", LevelLimits(rpm=100))
PROJ = Tenant("project", "playground", LevelLimits(rpm=10, tpm=1000, concurrency=2))
NOW = 1_000_050.0  # 30 s into the minute window [1_000_020, 1_000_080): windows are aligned to the epoch


def states(
    req_left: float = 10,
    tok_left: float = 1000,
    inflight: int = 0,
    team_left: float = 100,
    budget_left: float = 500 * MICROS,
) -> list[LevelState]:
    reset = window_bounds(NOW, 60)[1]
    return [
        LevelState(ORG, {"budget": Meter(500 * MICROS, budget_left, window_bounds(NOW, 30 * 86400)[1])}),
        LevelState(TEAM, {"requests": Meter(100, team_left, reset)}),
        LevelState(
            PROJ,
            {
                "requests": Meter(10, req_left, reset),
                "tokens": Meter(1000, tok_left, reset),
                "concurrency": Meter(2, 2 - inflight, None),
            },
        ),
    ]


def test_allowed_with_openai_headers() -> None:
    d = decide(states(req_left=4), Estimate(tokens=100), NOW)
    assert isinstance(d, Allowed)
    assert d.headers["x-ratelimit-limit-requests"] == "10"
    assert d.headers["x-ratelimit-remaining-requests"] == "3"  # this request charged
    assert d.headers["x-ratelimit-limit-tokens"] == "1000"
    assert d.headers["x-ratelimit-remaining-tokens"] == "900"
    assert d.headers["x-ratelimit-reset-requests"] == format_reset(window_bounds(NOW, 60)[1] - NOW)


def test_rpm_refuses_the_request_after_the_last() -> None:
    assert isinstance(decide(states(req_left=1), Estimate(tokens=1), NOW), Allowed)
    d = decide(states(req_left=0), Estimate(tokens=1), NOW)
    assert isinstance(d, LimitRefused)
    assert (d.level, d.tenant, d.metric) == ("project", "playground", "requests")
    assert d.retry_after == 30 and d.headers["retry-after"] == "30"
    assert d.headers["x-ratelimit-remaining-requests"] == "0"
    assert "playground" in d.message and "requests per minute" in d.message


def test_team_pool_refuses_for_its_projects() -> None:
    d = decide(states(team_left=0), Estimate(tokens=1), NOW)
    assert isinstance(d, LimitRefused) and (d.level, d.tenant, d.metric) == ("team", "research", "requests")


def test_tpm_refuses_when_estimate_does_not_fit() -> None:
    assert isinstance(decide(states(tok_left=100), Estimate(tokens=100), NOW), Allowed)
    d = decide(states(tok_left=99), Estimate(tokens=100), NOW)
    assert isinstance(d, LimitRefused) and d.metric == "tokens" and not d.never_fits
    too_big = decide(states(), Estimate(tokens=5000), NOW)
    assert isinstance(too_big, LimitRefused) and too_big.never_fits and "never" in too_big.message


def test_concurrency_refuses_at_the_limit_with_short_retry() -> None:
    assert isinstance(decide(states(inflight=1), Estimate(tokens=1), NOW), Allowed)
    d = decide(states(inflight=2), Estimate(tokens=1), NOW)
    assert isinstance(d, LimitRefused) and (d.metric, d.retry_after) == ("concurrency", 1)


def test_budget_refuses_at_the_org_when_spent() -> None:
    cost = request_cost(1000, 1000, input_per_million=1.0, output_per_million=3.0)
    assert cost == 0.004
    assert isinstance(decide(states(budget_left=to_micros(cost)), Estimate(1, cost), NOW), Allowed)
    d = decide(states(budget_left=to_micros(cost) - 1), Estimate(1, cost), NOW)
    assert isinstance(d, LimitRefused) and (d.level, d.tenant, d.metric) == ("organization", "acme", "budget")
    assert d.retry_after == round(window_bounds(NOW, 30 * 86400)[1] - NOW)
    assert "budget of 500" in d.message


def test_the_limit_that_frees_last_is_named() -> None:
    d = decide(states(req_left=0, budget_left=0), Estimate(1, 0.01), NOW)
    assert (
        isinstance(d, LimitRefused) and d.metric == "budget"
    )  # retrying when the minute ends would not help


def test_unlimited_tenant_has_no_headers() -> None:
    d = decide([LevelState(Tenant("project", "free"), {})], Estimate(10**9, 10**6), NOW)
    assert isinstance(d, Allowed) and d.headers == {}


def test_format_reset() -> None:
    assert [format_reset(s) for s in (0.02, 1, 59.2, 360, 3723)] == ["20ms", "1s", "1m0s", "6m0s", "1h2m3s"]


def test_level_limits_from_the_cluster_repo_document() -> None:
    from llmgw.core.config import models as config
    from llmgw.core.tenancy.limits import level_limits

    declared = config.Limits(rpm=600, tpm=200000, budget=config.Budget(amount=500, period="30d"))
    assert level_limits(declared) == LevelLimits(rpm=600, tpm=200000, budget=Budget(500, 30 * 86400))
    assert level_limits(config.Limits()) == LevelLimits()  # absent stays absent, not zero
