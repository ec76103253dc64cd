"""benchmarks/scheduling.py at a tiny size, so its machinery (sim engines, routers per strategy, the
streaming client, engine counters, the table and the final line) cannot rot. Speeds are not asserted."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"^scheduling: p99_ttft_default_over_rr=(\S+) p99_ttft_default_over_least_inflight=(\S+) "
    r"session_hit_rate=(\S+) session_max_load_over_mean=(\S+) prefix_p90_ttft_over_rr=\S+ "
    r"prefix_p90_ttft_over_session=\S+ prefix_throughput_over_least_inflight=\S+ "
    r"lowreuse_p99_over_least_inflight=\S+ prefix_p90_ttft_over_rr_closed=\S+ "
    r"prefix_p90_ttft_over_session_closed=\S+ lowreuse_p99_over_least_inflight_closed=\S+$",
    re.M,
)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_tiny_run_prints_tables_and_a_final_line_with_numbers() -> None:
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "scheduling.py"),
        "--loads",
        "0.8",
        "--workloads",
        "short,multiturn",
        "--window",
        "1.5",
        "--drain",
        "30",
        "--no-noslots",
        "--seed",
        "7",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for strategy in ("round-robin", "random", "least-inflight", "default", "session"):
        assert re.search(rf"^{strategy} +\d+ +0 ", out, re.M), (
            f"no row without failures for {strategy}:\n{out}"
        )
    assert "workload short" in out and "workload multiturn" in out
    match = FINAL.search(out)
    assert match is not None, out
    values = [float(v) for v in match.groups()]
    assert all(math.isfinite(v) and v >= 0 for v in values), match.group(0)
    assert 0 <= values[2] <= 1  # a hit rate
    assert values[3] >= 1  # the busiest replica carries at least the mean
    assert out.rstrip().endswith(match.group(0))  # the machine-readable line is the last one
