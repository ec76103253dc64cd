"""`plan --suggest` with the bench's spread (issue 51): each confirmed figure carries the interval `plan
--simulate`'s replays over the bench's passes give it, an objective the interval straddles is undecided (not
met, not missed; the suggestion is not proposed as meeting every objective and the command exits 4 as
`--simulate` does), a profile without a measured spread keeps its figures as points and says why, and the
table, the PR comment's chart and the console's SVG show the intervals."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from gitops.test_replay_uncertainty import append_passes

from llmgw.controller.console.suggested import chart as svg_chart
from llmgw.core.api.suggestions import PostedSuggestion, SuggestedCandidate, SuggestionBody
from llmgw.core.capacity.replay_spread import MODEL_ERROR_WORDS
from llmgw.core.capacity.spread import Interval
from llmgw.core.suggest.evaluate import Estimate, Need
from llmgw.core.suggest.render import Confirmed, Report, chart
from llmgw.core.suggest.search import Candidate, Result
from llmgw.core.suggest.served import SloRow
from llmgw.core.suggest.space import Choice
from llmgw.core.suggest.uncertainty import Judged, decided_at, judge

from . import test_suggest_plan as case

files = case.files  # the repo, its saved live states, the one-pass capacity file and the trace


# ------------------------------------------------------------------------------------------------ pure


def _row(objective: str, target: float, figure: float | None, project: str = "web") -> SloRow:
    met = None if figure is None else figure >= target if objective == "availability" else figure <= target
    return SloRow("chat", project, objective, target, figure, met)


def test_an_objective_is_met_missed_or_undecided_by_its_whole_interval() -> None:
    samples = {("chat", "web", "ttft_p99_ms"): [100.0] * 200}  # no sampling spread: the passes' alone
    passes = [[_row("ttft_p99_ms", 0, v)] for v in (90.0, 100.0, 112.0)]

    def state(target: float) -> Judged:
        return judge([_row("ttft_p99_ms", target, 100.0)], passes, samples, {"chat": True})[0]

    within, astride, past = state(200.0), state(110.0), state(50.0)
    assert within.figure is not None and within.figure.n == 3
    assert within.figure.low < 100.0 < within.figure.high and within.figure.mid == 100.0
    assert (within.state, astride.state, past.state) == ("pass", "undecided", "fail")
    assert "UNDECIDED (the interval straddles it)" in astride.words()
    assert f"100 [{within.figure.low:.0f}, {within.figure.high:.0f}] <= 110" in astride.words()


def test_without_a_measured_spread_the_figure_is_a_point_judged_as_before() -> None:
    passes = [[_row("ttft_p99_ms", 0, v)] for v in (50.0, 100.0, 200.0)]
    judged = judge([_row("ttft_p99_ms", 110.0, 100.0)], passes, {}, {"chat": False})[0]
    assert judged.figure == Interval(100.0, 100.0, 100.0, 1) and judged.state == "pass"
    assert "<= 110: met" in judged.words()


def test_the_replays_at_the_models_error_widen_a_figure_the_passes_left_a_point() -> None:
    passes = [[_row("ttft_p99_ms", 0, 100.0)] for _ in range(3)]  # the passes agree exactly
    slower, faster = [_row("ttft_p99_ms", 0, 118.0)], [_row("ttft_p99_ms", 0, 96.0)]
    alone = judge([_row("ttft_p99_ms", 110.0, 100.0)], passes, {}, {"chat": True})[0]
    bounded = judge([_row("ttft_p99_ms", 110.0, 100.0)], passes, {}, {"chat": True}, [slower, faster])[0]
    assert alone.figure is not None and (alone.figure.low, alone.figure.high) == (100.0, 100.0)
    assert alone.state == "pass"
    assert bounded.figure is not None and bounded.figure.mid == 100.0
    assert bounded.figure.low <= 96.0 and bounded.figure.high >= 118.0
    assert bounded.state == "undecided"  # 110 lies inside what the model's own error allows


def test_availability_ranges_over_the_replays() -> None:
    passes = [[_row("availability", 0, v)] for v in (0.995, 1.0)]
    judged = judge([_row("availability", 0.999, 1.0)], passes, {}, {"chat": True})[0]
    assert judged.figure == Interval(0.995, 1.0, 1.0, 3) and judged.state == "undecided"


def test_the_headroom_that_decides_it_is_the_fewest_replicas_under_the_shrunk_target() -> None:
    # The evaluator's p99 TTFT from 1..6 replicas; the interval's upper side is 1.25x the figure, so a
    # decided 500 ms objective needs an estimate of at most 400 ms.
    estimates = [900.0, 600.0, 450.0, 390.0, 380.0, 370.0]
    table = {0: tuple({"web": Estimate(e, e, 10.0, 1.0, 0.5)} for e in estimates)}
    choice = Choice("chat", "l4", "l4-24g", 1, 0.8, "test", "test", (Need(0, 3),), table=table)
    undecided = Judged("chat", "web", "ttft_p99_ms", 500.0, Interval(360.0, 440.0, 550.0, 3), "undecided")
    assert decided_at(choice, 0, 3, undecided) == 4
    hopeless = Judged("chat", "web", "ttft_p99_ms", 500.0, Interval(200.0, 400.0, 800.0, 3), "undecided")
    assert decided_at(choice, 0, 3, hopeless) is None  # 250 ms: no replica count gets there


def _confirmed(share: Interval, *, undecided: bool = False) -> Confirmed:
    """A replayed candidate as the chart reads it: its worst p99 TTFT's share of the objective."""
    return Confirmed(
        Candidate(()),
        800 * share.mid,
        None,
        1.0,
        share.mid,
        not undecided,
        undecided=("chat (web) ttft_p99_ms ...",) if undecided else (),
        share=share,
    )


def test_the_mermaid_chart_draws_the_upper_bounds_behind_the_figures() -> None:
    result = Result("exhaustive", 1, 1, None, (), (), None, "")
    spread = [
        _confirmed(Interval(0.6, 0.8, 1.1, 3), undecided=True),
        _confirmed(Interval(0.2, 0.3, 0.4, 3)),
    ]
    drawn = chart(Report(result, "cost", "USD", 1, 0, spread))
    assert "the taller bar: its interval's upper bound" in drawn
    assert "    bar [110, 40]\n    bar [80, 30]\n    line [100, 100]" in drawn
    points = [_confirmed(Interval(0.8, 0.8, 0.8, 1))]
    plain = chart(Report(result, "cost", "USD", 1, 0, points))
    assert "upper bound" not in plain and plain.count("    bar [") == 1  # no spread: one series, as before


def _candidate(
    name: str, share: float, low: float | None, high: float | None, **verdict: Any
) -> SuggestedCandidate:
    return SuggestedCandidate(
        name=name,
        configuration="chat: l4 x 7",
        chosen=name == "suggested",
        cost_per_hour=5.6 if name == "suggested" else 9.0,
        ttft_p99_ms=800 * share,
        ttft_share=share,
        tpot_p99_ms=None,
        availability=1.0,
        ttft_share_low=low,
        ttft_share_high=high,
        **{"met": True, "missed": [], **verdict},
    )


def test_the_console_svg_draws_each_interval_as_a_bar_through_its_point() -> None:
    body = SuggestionBody(
        revision="0123abcd",
        objective="cost",
        currency="USD",
        busiest_hour=0,
        found=False,
        method="exhaustive",
        replay="test",
        candidates=[
            _candidate("suggested", 0.8, 0.6, 1.5, met=False, undecided=["chat (web) ttft_p99_ms"]),
            _candidate("runner-up 1", 0.3, None, None),
        ],
        text="",
    )
    drawn = svg_chart(PostedSuggestion(suggestion=body, posted_at=0.0, posted_by="ci"))
    barred, point = drawn.points
    assert barred.low_y is not None and barred.high_y is not None
    assert barred.high_y < barred.y < barred.low_y  # SVG's y grows downward: the top of the bar is 150 %
    assert drawn.top <= barred.high_y, "the axis reaches the upper bound"
    assert barred.state == "undecided" and "[60, 150 %]" in barred.words
    assert (point.low_y, point.high_y, point.state) == (None, None, "met")
    assert "(no spread measured)" in point.words


# ------------------------------------------------------------------------------------------------ the CLI


def test_plan_suggest_shows_every_figure_with_its_interval_and_an_astride_objective_exits_4(
    files: dict[str, Path],
) -> None:
    capacity = copy.deepcopy(case.CAPACITY)
    append_passes(capacity["capacity"][0], (0.9, 1.0, 1.12))  # h100: three passes; l4: one
    files["capacity"].write_text(json.dumps(capacity))
    code, out, err = case.suggest(files, 8)
    assert code == 0, (out, err)
    row = next(line for line in out.splitlines() if line.startswith("  suggested (chat: l4 x 7)"))
    assert " [" not in row, row  # the l4's spread is unknown: points, not a zero-width interval
    assert "intervals of suggested: 90%, one replay per bench pass (3 passes)" in out
    assert "; no interval for chat/l4: one bench pass" in out
    runner = next(line for line in out.splitlines() if line.startswith("  runner-up 1 (chat: h100 x 3)"))
    assert runner.count(" [") == 2, runner

    append_passes(capacity["capacity"][1], (0.9, 1.0, 1.12))
    files["capacity"].write_text(json.dumps(capacity))
    code, out, err = case.suggest(files, 8)
    assert code == 0, (out, err)
    assert "| p90 TTFT ms | p99 TTFT ms | p99 TPOT ms |" in out
    row = next(line for line in out.splitlines() if line.startswith("  suggested (chat: l4 x 7)"))
    assert row.count(" [") == 2 and row.endswith("| met"), row  # p99 TTFT and TPOT with their intervals
    assert "intervals: 90%, one replay per bench pass (3 passes)" in out

    # An objective inside the l4's p99 interval: neither met nor missed, and the plan says what decides it.
    model = files["root"] / "models" / "chat.yaml"
    model.write_text(case.CHAT.replace("ttft_p99_ms: 800", "ttft_p99_ms: 500"))
    code, out, err = case.suggest(files, 8, "--format", "markdown")
    assert code == 4, (out, err)
    assert "the suggestion's replay is undecided" in err and "exit 4" in err
    assert "- not proposed as meeting every objective: its replay leaves some undecided" in out
    assert (
        "- undecided: chat (web) ttft_p99_ms " in out
        and "<= 500: UNDECIDED (the interval straddles it)" in out
    )
    assert "no count of l4 replicas the search weighs decides it" in out  # prefill alone is near 500 ms
    assert "- runner-up 1 meets every objective with its whole interval, at 9.00 USD/h" in out
    assert "| UNDECIDED: chat (batch) ttft_p99_ms" in out
    assert "the taller bar: its interval's upper bound" in out


def test_passes_that_agree_exactly_still_carry_the_models_error(files: dict[str, Path]) -> None:
    capacity = copy.deepcopy(case.CAPACITY)
    for row in capacity["capacity"]:
        append_passes(row, (1.0, 1.0, 1.0))
    files["capacity"].write_text(json.dumps(capacity))
    code, out, err = case.suggest(files, 8)
    assert code == 0, (out, err)
    assert f"percentiles and {MODEL_ERROR_WORDS}, around the pooled fit's replay" in out, out
    row = next(line for line in out.splitlines() if line.startswith("  suggested (chat: l4 x 7)"))
    figures = [tuple(map(float, f)) for f in re.findall(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", row)]
    assert len(figures) == 2, row  # p99 TTFT and p99 TPOT
    for mid, _, high in figures:  # every cost 15 % higher reaches past the trace's own sampling
        assert high >= 1.14 * mid, row


def test_one_bench_pass_keeps_the_figures_points_and_says_why(files: dict[str, Path]) -> None:
    code, out, _ = case.suggest(files, 8)
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("  suggested (chat: l4 x 7)"))
    assert " [" not in row, row
    assert (
        "intervals of suggested: no spread measured, the figures are points: chat/l4: one bench pass" in out
    )
    assert "intervals of runner-up 1: no spread measured, the figures are points: chat/h100: one bench" in out
