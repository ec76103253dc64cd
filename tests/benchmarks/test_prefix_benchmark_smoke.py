"""benchmarks/scheduling.py's prefix workloads at a tiny size, so their machinery (sim engines publishing KV
events, routers subscribed to them, the closed-loop client, the tables and the final line's prefix fields)
cannot rot. Speeds are not asserted: benchmarks measure them, on a quiet machine."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIELDS = re.compile(
    r" prefix_p90_ttft_over_rr=(\S+) prefix_p90_ttft_over_session=(\S+) "
    r"prefix_throughput_over_least_inflight=(\S+) lowreuse_p99_over_least_inflight=(\S+)$",
    re.M,
)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_tiny_prefix_run_prints_both_tables_and_the_prefix_fields() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "scheduling.py"), "--workloads", "prefix,lowreuse",
            "--window", "4", "--seed", "7"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "## workload prefix" in out and "## workload lowreuse" in out, out
    for strategy in ("round-robin", "least-inflight", "session", "prefix", "prefix-approx"):
        assert len(re.findall(rf"^{strategy} +[1-9]\d* +0 ", out, re.M)) == 2, f"{strategy}:\n{out}"
    match = FIELDS.search(out)
    assert match is not None, out
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in match.groups()), match.group(0)
