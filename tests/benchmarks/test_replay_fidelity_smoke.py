"""benchmarks/replay_fidelity.py at a tiny size on the sim fleet, so its machinery (four sim engines, the bench's
passes and drift probes, the fitted model and its spread, a real router driven by the trace, the replay with
its intervals and the final line) cannot rot. Errors are not
asserted within the target here (seconds of load on a shared machine): that they are numbers is."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"^replay_fidelity: runs=1 sim_p99_err=(\S+) gemma_p99_err=(\S+) vllm_p99_err=(\S+) sim_p50_err=(\S+) "
    r"gemma_p50_err=(\S+) vllm_p50_err=(\S+) covered=([01])/1$",
    re.M,
)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_tiny_sim_run_prints_measured_predicted_with_intervals_and_a_final_line() -> None:
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "replay_fidelity.py"),
        "--only",
        "sim",
        "--runs",
        "1",
        "--minutes",
        "0.15",
        "--min-requests",
        "30",
        "--bench-seconds",
        "1.5",
        "--prompt-words",
        "16",
        "--repeats",
        "2",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^  bench attempt 1: the engine's speed (held|drifted)", out, re.M), out
    # Every fitted parameter with its interval over the two passes.
    assert re.search(r"^    prefill_ms_per_token +\[-?[0-9.]+, -?[0-9.]+\] over 2 passes$", out, re.M), out
    # Measured against predicted with the plan's interval, the error, whether inside, and the width.
    assert re.search(r"^  p99 TTFT +\d+ +\d+ \[\d+, \d+\] +[0-9.]+ +(yes|no) +±\d+%$", out, re.M), out
    assert re.search(r"requests, 0 refused, 0 failed", out), out  # every request answered
    match = FINAL.search(out)
    assert match is not None, out
    assert out.rstrip().endswith(match.group(0))
    sim_p99, gemma_p99, vllm_p99, sim_p50, gemma_p50, vllm_p50, _ = match.groups()
    assert (gemma_p99, gemma_p50, vllm_p99, vllm_p50) == ("NA",) * 4  # --only sim
    assert all(math.isfinite(float(v)) and float(v) >= 0 for v in (sim_p99, sim_p50)), match.group(0)
