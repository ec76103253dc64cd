"""benchmarks/listener_flood.py at a tiny size, so its machinery (the router with a key and a guardrail, the
flood of stalled heads from one address, the timed requests, the big-prompt thread and the final line) cannot
rot. Speeds are not asserted."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"^listener_flood: unloaded_p50_ms=(\S+) unloaded_p99_ms=(\S+) flooded_p50_ms=(\S+) flooded_p99_ms=(\S+) "
    r"ratio_p50=(\S+) ratio_p99=(\S+) idle=(\d+) prompt_bytes=(\d+) prompts_answered=(\d+)$",
    re.M,
)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_tiny_run_times_keyed_requests_under_a_flood_and_ends_with_the_final_line() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "listener_flood.py")]
    argv += ["--requests", "10", "--idle", "300", "--prompt-bytes", "2000"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=220, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    match = FINAL.search(done.stdout)
    assert match is not None, done.stdout
    assert done.stdout.rstrip().endswith(match.group(0))  # the machine-readable line is the last one
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in match.groups()[:6]), match.group(0)
    # 300 stalled heads from one address, over the per-address cap of 256: every keyed request was still 200
    # (the script fails otherwise), and the guarded prompts were answered while it ran.
    assert (int(match[7]), int(match[8])) == (300, 2000) and int(match[9]) >= 1
