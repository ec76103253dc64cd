"""benchmarks/prefix_scoring_cpu.py at a tiny size: both request paths run the router's code, the prefix path's
parts add up, and the machine-readable line is printed. CPU figures are not asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(
    r"^prefix_scoring_cpu: least_inflight_us=([\d.]+) prefix_us=([\d.]+) prefix_over_least_inflight=([\d.]+) "
    r"events_us=([\d.]+) prefix_core_share_at_100rps=(-?[\d.]+)$",
    re.M,
)


def test_a_tiny_run_measures_both_paths_and_the_prefix_paths_parts() -> None:
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "prefix_scoring_cpu.py"),
        "--requests",
        "50",
        "--repeats",
        "1",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    match = LINE.search(done.stdout)
    assert match is not None, done.stdout
    least, prefix, ratio, events, _ = (float(v) for v in match.groups())
    assert least > 0 and prefix > 0 and events > 0 and abs(ratio - prefix / least) < 0.01 * ratio + 0.002
    parts = re.findall(r"^  (\w+) +([\d.]+) us/request", done.stdout, re.M)
    assert [p[0] for p in parts] == [
        "key",
        "candidates",
        "annotate",
        "schedule",
        "placed",
        "events_decode",
        "events_apply",
    ], done.stdout
