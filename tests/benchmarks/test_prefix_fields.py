"""The prefix workloads' final-line fields: latency ratios from the open loop, throughput from the closed loop,
and the closed loop's latency ratios kept beside them under `_closed` names."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from scheduling_prefix import PrefixRow, Round, Sample, prefix_fields, summarize_rounds


def _row(name: str, p90: float, p99: float, rps: float) -> PrefixRow:
    return PrefixRow(name, 100, 0, p90 / 2, p90, p99, rps, None, [])


def _fields(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in (kv.split("=") for kv in line.split())}


def test_latency_comes_from_the_open_loop_and_throughput_from_the_closed_loop() -> None:
    rows = {
        "prefix": {
            n: _row(n, p90, 1.0, rps)
            for n, p90, rps in (
                ("prefix", 0.2, 120.0),
                ("round-robin", 0.5, 90.0),
                ("session", 0.8, 80.0),
                ("least-inflight", 0.4, 96.0),
            )
        },
        "prefix-open": {
            n: _row(n, p90, 1.0, 60.0)
            for n, p90 in (
                (
                    "prefix",
                    0.02,
                ),
                ("round-robin", 0.4),
                ("session", 0.5),
                ("least-inflight", 0.4),
            )
        },
        "lowreuse": {n: _row(n, 0.1, p99, 100.0) for n, p99 in (("prefix", 0.2), ("least-inflight", 0.16))},
        "lowreuse-open": {
            n: _row(n, 0.1, p99, 80.0) for n, p99 in (("prefix", 0.1), ("least-inflight", 0.1))
        },
    }
    got = _fields(prefix_fields(rows))
    assert got["prefix_p90_ttft_over_rr"] == 0.05 and got["prefix_p90_ttft_over_session"] == 0.04
    assert got["prefix_throughput_over_least_inflight"] == 1.25
    assert got["lowreuse_p99_over_least_inflight"] == 1.0
    assert got["prefix_p90_ttft_over_rr_closed"] == 0.4 and got["prefix_p90_ttft_over_session_closed"] == 0.25
    assert got["lowreuse_p99_over_least_inflight_closed"] == 1.25


def test_a_phase_not_run_reads_nan_not_zero() -> None:
    got = _fields(prefix_fields({}))
    assert len(got) == 7 and all(math.isnan(v) for v in got.values())


def test_a_rows_figures_are_the_median_of_its_rounds_so_one_disturbed_round_moves_them_little() -> None:
    def round_of(ttft: float, n: int) -> Round:
        return Round([Sample(ttft, True)] * n, 10.0, 5.0, [float(n)], 1.0)

    row = summarize_rounds("x", [round_of(0.1, 50), round_of(0.1, 52), round_of(3.0, 10)])
    assert row.p90 == 0.1 and row.p99 == 0.1  # pooled, the slow round's tenth of the samples would be the p99
    assert row.throughput == 50.0
    assert row.requests == 112 and row.hit_rate == 0.5 and row.per_replica == [112]
