"""benchmarks/replay_scale.py at a tiny size, so its machinery (the fitted fleet, the diurnal trace, the replay,
the busy-time buckets and the final line) cannot rot. Speeds are not asserted: shapes and numbers are."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"^replay_scale: nodes=(\d+) requests=(\d+) peak_utilization=([0-9.]+) seconds=([0-9.]+)$", re.M
)


def test_tiny_day_prints_a_final_line_with_numbers() -> None:
    # Two hours around the 16:00 peak would need the whole day's generator: a short day from midnight is
    # enough to run every part, and its trough load must still be served without refusals.
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "replay_scale.py"),
        "--nodes",
        "4",
        "--models",
        "2",
        "--hours",
        "0.5",
        "--peak",
        "0.9",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    match = FINAL.search(out)
    assert match is not None, out
    assert out.rstrip().endswith(match.group(0))
    nodes, requests, peak, _ = match.groups()
    assert nodes == "4" and int(requests) > 0
    assert 0.0 < float(peak) <= 1.0
    served = re.search(r"^replay: [0-9.]+ s \([0-9.]+ s of CPU\); served (\d+), refused (\d+)$", out, re.M)
    assert served is not None, out
    assert int(served.group(1)) + int(served.group(2)) == int(requests)
    assert len(re.findall(r"^  chat-\d: p50 \d+ ms, p99 \d+ ms, utilization \d+%$", out, re.M)) == 2
