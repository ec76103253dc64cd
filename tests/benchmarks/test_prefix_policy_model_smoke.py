"""benchmarks/prefix_policy_model.py at a tiny size, so the model (the router's schedule() driven by a
discrete-event fleet) cannot rot. It asserts the output's shape and the model's bookkeeping, not speeds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(
    r"^(round-robin|least-inflight|prefix lb=\S+)\s+(\d+)ms\s+(\d+)ms\s+(\d+)ms\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)%$",
    re.M,
)


def test_a_tiny_model_run_prints_every_strategy_and_the_summary_line() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "prefix_policy_model.py"), "--seeds", "1",
            "--warmup", "0.5", "--window", "1", "--load-bounds", "1.5"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {m[0]: m for m in ROW.findall(done.stdout)}
    assert set(rows) == {"round-robin", "least-inflight", "prefix lb=1.5"}, done.stdout
    for _, p50, p90, p99, rps, hit, waited in rows.values():
        assert int(p50) <= int(p90) <= int(p99) and float(rps) > 0 and 0 <= float(hit) <= 100
        assert 0 <= float(waited) <= 100
    assert re.search(r"^prefix_model: best=prefix_lb=1.5 p90_over_rr=\S+ throughput_over_least_inflight=\S+$",
                     done.stdout, re.M), done.stdout  # fmt: skip
