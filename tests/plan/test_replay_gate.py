"""plan --simulate's verdict: which differences between the current and the planned fleet are regressions."""

from __future__ import annotations

from llmgw.core.capacity.replay_gate import Figures, percent, regressions, render_text
from llmgw.core.config.models import SimulateSettings

NONE = {"queue_full": 0, "queue_timeout": 0, "unavailable": 0}


def fig(p99: float | None, refused: int = 0, requests: int = 1000, model: str = "m") -> Figures:
    return Figures(model, requests, requests - refused, {**NONE, "queue_timeout": refused}, 10.0, p99, 0.5)


LIMITS = SimulateSettings(max_p99_ttft_increase="20%", max_refusals_increase="1%")


def test_percent_reads_the_schema_shape() -> None:
    assert percent("20%") == 0.2 and percent("0.5%") == 0.005 and percent("100%") == 1.0


def test_p99_within_the_threshold_is_no_regression_and_past_it_is() -> None:
    assert regressions({"m": fig(100.0)}, {"m": fig(120.0)}, LIMITS) == []
    (line,) = regressions({"m": fig(100.0)}, {"m": fig(121.0)}, LIMITS)
    assert (
        line == "model m: p99 TTFT 100 ms -> 121 ms (+21%; spec.plan.simulate.max_p99_ttft_increase is 20%)"
    )


def test_refusals_are_compared_in_percentage_points() -> None:
    assert regressions({"m": fig(100.0, 50)}, {"m": fig(100.0, 60)}, LIMITS) == []  # 5% -> 6%
    (line,) = regressions({"m": fig(100.0, 50)}, {"m": fig(100.0, 61)}, LIMITS)
    assert line.startswith("model m: refused 5.0% -> 6.1% of its requests (61 queue timeout;")


def test_a_model_the_current_fleet_never_served_is_judged_by_its_refusals_only() -> None:
    # No current p99 to compare with: unknown is not zero, so a slow planned p99 is not a "rise".
    assert regressions({"m": fig(None, 1000)}, {"m": fig(5000.0, 0)}, LIMITS) == []
    # A model the planned fleet drops refuses everything: that is a regression.
    gone = Figures("m", 1000, 0, {**NONE, "unavailable": 1000}, None, None, None)
    (line,) = regressions({"m": fig(100.0)}, {"m": gone}, LIMITS)
    assert "refused 0.0% -> 100.0%" in line and "1000 unavailable" in line


def test_the_section_lists_both_fleets_assumptions_and_the_verdict() -> None:
    gone = Figures("m", 1000, 0, {**NONE, "unavailable": 1000}, None, None, None)
    text = render_text("trace t", {"m": fig(100.0)}, {"m": gone}, ["r1"], ["m/p: not measured"])
    assert text.splitlines() == [
        "",
        "Simulated serving (virtual time, trace t):",
        "model m",
        "  current  p50     10 ms  p99    100 ms  refused 0/1000  utilization 50%",
        "  planned  p50      - ms  p99      - ms  refused 1000/1000 (1000 unavailable)  utilization no replica",
        "Assumed (not measured):",
        "  m/p: not measured",
        "Regressions (1):",
        "  r1",
    ]
