"""`plan --simulate` with the bench's spread: every figure with its interval (one replay per bench pass), a
verdict whose interval straddles a threshold or an SLO said as undecided (exit 4) rather than passed or failed,
and near modelled capacity the warning that the prediction is least reliable there, with the headroom that
would make it reliable. The interval arithmetic is pure and checked against values worked by hand; the rest
runs through the CLI on the replay tests' repo, state and trace (tests/gitops/test_replay_cli.py)."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from gitops.test_replay_cli import CAPACITY, live_with_two, run, write_repo
from llmgw.core.capacity.replay_gate import Figures
from llmgw.core.capacity.replay_spread import (
    MODEL_SLOWER,
    Spread,
    cliff_words,
    figure_spread,
    judge_ratio,
    judge_slo,
    quantile_interval,
    reliable_load,
    spread_of,
)
from llmgw.core.capacity.spread import Interval
from llmgw.core.traffic.trace import TracedRequest, TraceHeader, format_trace

# ------------------------------------------------------------------------------------------------ pure


def test_a_figure_is_the_pooled_replay_with_the_passes_prediction_interval() -> None:
    point = spread_of(100.0, [None, 120.0])  # one pass with the figure: no spread known
    assert point is not None and (point.low, point.mid, point.high, point.n) == (100.0, 100.0, 100.0, 1)
    assert spread_of(None, [1.0, 2.0]) is None  # unknown stays unknown
    wide, narrow = spread_of(100.0, [80.0, 100.0, 125.0]), spread_of(100.0, [98.0, 100.0, 102.0])
    assert wide is not None and narrow is not None
    assert wide.mid == narrow.mid == 100.0  # the figure shown is the pooled fit's replay
    assert wide.low < 80.0 and wide.high > 125.0  # one more pass may land past the three seen
    assert narrow.relative < 0.1 < wide.relative


def test_a_percentile_carries_the_traces_own_sampling() -> None:
    values = [float(v) for v in range(1, 401)]  # 400 requests, TTFTs 1..400 ms
    p99 = quantile_interval(values, 0.99)
    # The p99 is the 396th; with 400 draws the 90 % ranks span 396 ± 1.645·√(400·0.99·0.01) = ±3.3.
    assert p99 is not None and (p99.low, p99.mid, p99.high) == (392.0, 396.0, 400.0)
    p50 = quantile_interval(values, 0.5)
    assert p50 is not None and p50.low == 183.0 and p50.mid == 200.0 and p50.high == 217.0
    assert quantile_interval([], 0.5) is None


def test_a_ratio_past_the_threshold_fails_within_passes_and_astride_is_undecided() -> None:
    passes = [(100.0, 105.0), (110.0, 117.0), (90.0, 94.0)]
    assert judge_ratio("chat", (100.0, 105.0), passes, 0.2).state == "pass"
    assert (
        judge_ratio("chat", (100.0, 150.0), [(100.0, 150.0), (110.0, 160.0), (90.0, 140.0)], 0.2).state
        == "fail"
    )
    astride = judge_ratio("chat", (100.0, 120.0), [(100.0, 110.0), (100.0, 130.0), (100.0, 121.0)], 0.2)
    assert astride.state == "undecided" and "neither passed nor failed" in astride.words
    unknown = judge_ratio("chat", (100.0, 119.0), [None, None], 0.2)
    assert unknown.state == "pass" and "no spread measured" in unknown.words  # a point judges as before
    assert judge_slo("chat", Interval(900.0, 1000.0, 1200.0, 3), 1100.0).state == "undecided"
    assert "met" in judge_slo("chat", Interval(900.0, 1000.0, 1050.0, 3), 1100.0).words
    assert judge_slo("chat", Interval(1150.0, 1200.0, 1300.0, 3), 1100.0).state == "fail"


def _spread(p99: Interval, load: Interval | None) -> Spread:
    return Spread("chat", p99, p99, load, (0, 0, 0), 300)


def test_near_capacity_the_plan_says_so_and_shows_the_headroom_that_would_make_it_reliable() -> None:
    # The engine's speed spreads ±10 % over the passes and the model's own error is up to 15 % slower: together
    # (they are independent) 18 %. An M/M/1 queue amplifies that by 1/(1-load), so the p99 holds to ±35 % up to
    # 1 - 0.180/0.35 = 48.5 % of capacity.
    assert MODEL_SLOWER == 0.15
    assert reliable_load(0.10) == pytest.approx(1 - math.hypot(0.10, 0.15) / 0.35)
    assert reliable_load(0.0) == pytest.approx(1 - 0.15 / 0.35)  # no spread measured: the model's error stays
    assert reliable_load(0.32) is None
    near = cliff_words(_spread(Interval(500.0, 1000.0, 2500.0, 3), Interval(0.81, 0.9, 0.99, 3)), 2, 2.0)
    assert near is not None and "least reliable" in near and "at 90% of modelled capacity" in near
    # 2 replicas at 90 % need ceil(2 * 0.9 / 0.485) = 4 to come down to 48.5 %; or 2.0 * 0.485 / 0.9 requests/s.
    assert "4 replicas instead of 2" in near and "at most 1.08 requests/s" in near, near
    assert (
        cliff_words(_spread(Interval(900.0, 1000.0, 1200.0, 3), Interval(0.45, 0.5, 0.55, 3)), 2, 1.0) is None
    )
    # At the reliable load already (33 % against 1 - hypot(0.18, 0.15)/0.35 = 32 %, within
    # its rounding): more replicas would not
    # help.
    at_limit = cliff_words(_spread(Interval(100.0, 167.0, 234.0, 3), Interval(0.27, 0.33, 0.39, 3)), 1, 13.0)
    assert (
        at_limit is not None and "not the load's doing" in at_limit and "replicas instead" not in at_limit
    ), at_limit
    noisy = cliff_words(_spread(Interval(100.0, 1000.0, 3000.0, 3), Interval(0.3, 0.5, 0.8, 3)), 2, 1.0)
    assert noisy is not None and "bench again in a quieter hour" in noisy
    # Far from capacity with a wide speed spread (±24 %: reliable up to 1 - hypot(0.24, 0.15)/0.35 = 19 %): not
    # "near capacity", but the spread, and still the replicas that would bring it within.
    spread_wide = cliff_words(
        _spread(Interval(100.0, 500.0, 1000.0, 3), Interval(0.25, 0.33, 0.41, 3)), 1, 1.0
    )
    assert spread_wide is not None and "near capacity" not in spread_wide, spread_wide
    assert "the engine's speed spreads ±24% over the bench's passes" in spread_wide, spread_wide
    assert "2 replicas instead of 1" in spread_wide, spread_wide


def test_the_refusals_range_over_the_replays() -> None:
    central = Figures("chat", 10, 9, {"queue_full": 1}, 50.0, 90.0, 0.5)
    passes = [
        Figures("chat", 10, 10, {}, 40.0, 80.0, 0.4),
        Figures("chat", 10, 7, {"queue_timeout": 3}, 60.0, 120.0, 0.6),
    ]
    s = figure_spread(central, passes, 0.7, [0.6, 0.8])
    assert s.refused == (0, 1, 3) and s.p99 is not None and s.p99.low < 80.0 and s.load is not None


# ------------------------------------------------------------------------------------------------ the CLI


def with_passes(scales: tuple[float, ...]) -> dict[str, Any]:
    """The replay tests' measurement with one pass per scale (`append_passes`)."""
    capacity = copy.deepcopy(CAPACITY)
    append_passes(capacity["capacity"][0], scales)
    return capacity


def append_passes(row: dict[str, Any], scales: tuple[float, ...]) -> None:
    """One pass per scale appended to a capacity row's curve: every cost times it (a slower or faster moment
    of the same engine), each step marked by its pass."""
    measured = row["measured"]
    pooled = list(measured["curve"])  # a copy: the passes are appended to the curve itself
    for k, scale in enumerate(scales, start=1):
        for step in pooled:
            measured["curve"].append(
                {
                    **step,
                    "seconds": step["seconds"] * scale,
                    "ttft_p50_ms": step["ttft_p50_ms"] * scale,
                    "itl_p50_ms": step["itl_p50_ms"] * scale,
                    "tokens_per_s": step["tokens_per_s"] / scale,
                    "repeat": k,
                }
            )


@pytest.fixture
def spread_files(tmp_path: Path) -> dict[str, Path]:
    applied = write_repo(tmp_path / "applied", 2)
    state = tmp_path / "state.json"
    state.write_text(live_with_two(applied).model_dump_json())
    capacity = tmp_path / "capacity.json"
    capacity.write_text(json.dumps(with_passes((0.92, 1.0, 1.1))))
    # As the replay tests' trace: about 70 % of two replicas, 140 % of one; 200 requests keep it quick.
    requests = [TracedRequest(i * 0.4, "chat", "p", 128, 100, stream=True) for i in range(200)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(format_trace(TraceHeader(0.0, 80.0, "test"), requests)) + "\n")
    return {"state": state, "capacity": capacity, "trace": trace, "root": tmp_path}


def simulate(files: dict[str, Path], repo: Path) -> tuple[int, str, str]:
    return run(
        "plan",
        str(repo),
        "--state",
        str(files["state"]),
        "--trace",
        str(files["trace"]),
        "--capacity",
        str(files["capacity"]),
    )


FIGURE = re.compile(
    r"^  (current|planned) +p50 (\d+) \[(\d+), (\d+)\] ms  p99 (\d+) \[(\d+), (\d+)\] ms", re.M
)


def test_every_figure_carries_its_interval_and_the_same_fleet_passes(spread_files: dict[str, Path]) -> None:
    code, out, err = simulate(spread_files, write_repo(spread_files["root"] / "same", 2))
    assert code == 0, (out, err)
    assert "With their intervals (90%: one replay per bench pass, 3 passes" in out
    rows = FIGURE.findall(out)
    assert [r[0] for r in rows] == ["current", "planned"], out
    for _, p50, p50_low, p50_high, p99, low, high in rows:
        assert int(p50_low) <= int(p50) <= int(p50_high) and int(low) < int(p99) < int(high)
    # Both fleets replay with the same pass's models: the speed they share cancels, the ratio is exactly 1.
    assert "No regression past spec.plan.simulate's thresholds." in out and "Undecided" not in out


def test_a_threshold_inside_the_interval_is_undecided_exit_4(spread_files: dict[str, Path]) -> None:
    lax = "\n  plan: {simulate: {max_p99_ttft_increase: 100000%, max_refusals_increase: 100%}}"
    code, out, _ = simulate(spread_files, write_repo(spread_files["root"] / "lax", 1, lax))
    assert code == 0, out
    found = re.search(r"planned/current ([\d.]+) \[([\d.]+), ([\d.]+)\]", out)
    assert found is not None, out
    mid, low, high = (float(g) for g in found.groups())
    assert low < mid < high
    # A threshold at the ratio itself: the interval straddles it.
    astride = f"\n  plan: {{simulate: {{max_p99_ttft_increase: {(mid - 1) * 100:.1f}%, max_refusals_increase: 100%}}}}"
    code, out, err = simulate(spread_files, write_repo(spread_files["root"] / "astride", 1, astride))
    assert code == 4, (out, err)
    assert "Undecided (1; the interval straddles the threshold):" in out
    assert "neither passed nor failed" in out and "No regression" not in out
    assert "undecided (1)" in err and "exit 4" in err


def test_halving_is_a_regression_in_every_replay_and_near_capacity_is_flagged(
    spread_files: dict[str, Path],
) -> None:
    code, out, err = simulate(spread_files, write_repo(spread_files["root"] / "half", 1))
    assert code == 3, (out, err)
    regressions = out.split("Regressions (")[1]
    assert "model chat: p99 TTFT 64 ms -> " in regressions and "planned/current " in regressions, out
    assert re.search(
        r"refusals rise past spec.plan.simulate.max_refusals_increase \(1%\) in \d of 4 replays", out
    )
    # One replica at 140 % of its modelled capacity: the planned fleet's figures are near (past) the cliff.
    assert "planned: model chat: p99 TTFT" in out and "least reliable" in out, out
    assert "bench again in a quieter hour" in out  # the passes' speed spreads ±35 %: no load is reliable


def test_a_measurement_without_passes_prints_points_as_before(tmp_path: Path) -> None:
    applied = write_repo(tmp_path / "applied", 2)
    files = {"state": tmp_path / "s.json", "capacity": tmp_path / "c.json", "trace": tmp_path / "t.jsonl"}
    files["state"].write_text(live_with_two(applied).model_dump_json())
    files["capacity"].write_text(json.dumps(CAPACITY))
    requests = [TracedRequest(i * 0.4, "chat", "p", 128, 100, stream=True) for i in range(50)]
    files["trace"].write_text("\n".join(format_trace(TraceHeader(0.0, 20.0, "test"), requests)) + "\n")
    code, out, _ = simulate(files, applied)
    assert code == 0 and "With their intervals" not in out and "[" not in out.split("Simulated serving")[1]
