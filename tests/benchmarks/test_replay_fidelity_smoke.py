"""benchmarks/replay_fidelity.py at a tiny size on the sim fleet, so its machinery (four sim engines, the bench,
the fitted model, a real router driven by the trace, the replay and the final line) cannot rot. Errors are not
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
    r"^replay_fidelity: sim_p99_err=(\S+) gemma_p99_err=(\S+) sim_p50_err=(\S+) gemma_p50_err=(\S+)$", re.M
)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_tiny_sim_run_prints_measured_simulated_and_a_final_line() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "replay_fidelity.py"), "--only", "sim", "--minutes",
            "0.15", "--bench-seconds", "1.5", "--prompt-words", "16"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(
        # the ladder's concurrency 1, the short and the long probe, then concurrency 2
        r"^sim: 4 replica\(s\) x 2 slots; bench p50 \(ms\): c1 ttft \d+ itl \d+ prompt \d+, "
        r"c1 ttft \d+ itl \d+ prompt \d+, c1 ttft \d+ itl \d+ prompt \d+, c2 ",
        out,
        re.M,
    ), out
    assert re.search(r"^  p99 TTFT +\d+ +\d+ +[0-9.]+$", out, re.M), out
    assert re.search(r"^  failed +0$", out, re.M), out  # every request answered
    match = FINAL.search(out)
    assert match is not None, out
    assert out.rstrip().endswith(match.group(0))
    sim_p99, gemma_p99, sim_p50, gemma_p50 = match.groups()
    assert (gemma_p99, gemma_p50) == ("NA", "NA")  # --only sim
    assert all(math.isfinite(float(v)) and float(v) >= 0 for v in (sim_p99, sim_p50)), match.group(0)
