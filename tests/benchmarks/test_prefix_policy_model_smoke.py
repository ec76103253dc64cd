"""benchmarks/prefix_policy_model.py at a tiny size, so the model (the router's schedule() driven by a
discrete-event fleet) cannot rot. It asserts the output's shape and the model's bookkeeping, not speeds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(
    r"^(round-robin|least-inflight|session|prefix lb=\S+)\s+(\d+)ms\s+(\d+)ms\s+(\d+)ms\s+([\d.]+)\s+([\d.]+)%"
    r"\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%$",
    re.M,
)
OPEN = re.compile(
    r"^## (\w+): open loop, Poisson arrivals at ([\d.]+) req/s \(0\.8 of the lowest closed-loop throughput, "
    r"([\w -]+?)'s ([\d.]+)\)$",
    re.M,
)


def _run(*args: str) -> str:
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "prefix_policy_model.py"),
        "--seeds",
        "1",
        "--warmup",
        "0.5",
        "--window",
        "1",
        "--load-bounds",
        "1.5",
        *args,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _phases(out: str) -> dict[str, dict[str, tuple[str, ...]]]:
    found = {}
    for block in out.split("\n## ")[1:]:
        title = re.match(r"(\w+): (closed|open) loop", block)
        assert title is not None, block
        found[" ".join(title.groups())] = {m[0]: m for m in ROW.findall(block)}
    return found


def test_a_tiny_model_run_prints_both_phases_for_every_strategy_and_the_summary_lines() -> None:
    out = _run("--workloads", "prefix,lowreuse")
    phases = _phases(out)
    assert set(phases) == {"prefix closed", "prefix open", "lowreuse closed", "lowreuse open"}, out
    for name, rows in phases.items():
        assert set(rows) == {"round-robin", "least-inflight", "session", "prefix lb=1.5"}, (name, out)
        for _, p50, p90, p99, rps, hit, waited, missed, hit_waited in rows.values():
            assert int(p50) <= int(p90) <= int(p99) and float(rps) > 0 and 0 <= float(hit) <= 100
            assert 0 <= float(waited) <= 100 and float(missed) + float(hit_waited) <= 100.05
    # the open loop's rate: 0.8 of the lowest closed-loop throughput of that workload's strategies
    for workload, rate, lowest, lowest_rps in OPEN.findall(out):
        closed = {n: float(m[4]) for n, m in phases[f"{workload} closed"].items()}
        assert lowest in closed and min(closed.values()) == float(lowest_rps) == closed[lowest]
        assert abs(float(rate) - 0.8 * float(lowest_rps)) <= 0.06
    assert len(OPEN.findall(out)) == 2, out
    assert re.search(
        r"^prefix_model: policy=prefix_lb=1.5 p90_over_rr=\S+ p90_over_session=\S+ "
        r"throughput_over_least_inflight=\S+ p90_over_rr_closed=\S+ p90_over_session_closed=\S+$",
        out,
        re.M,
    ), out
    assert re.search(
        r"^lowreuse_model: policy=prefix_lb=1.5 p99_over_least_inflight=\S+ p99_over_least_inflight_closed=\S+$",
        out,
        re.M,
    ), out


def test_every_strategy_meets_the_same_arrivals_in_the_open_loop() -> None:
    """The workload's draws are apart from the picker's, so at a rate every strategy carries each completes
    the same requests (the count of a window's arrivals is the strategy-independent part)."""
    rows = _phases(_run("--workloads", "lowreuse"))["lowreuse open"]
    assert len({m[4] for m in rows.values()}) == 1, rows
