"""benchmarks/scheduling.py's prefix workloads at a tiny size, so their machinery (sim engines publishing KV
events, routers subscribed to them, the closed-loop and the open-loop client, the tables and the final line's
prefix fields) cannot rot. Speeds are not asserted: benchmarks measure them, on a quiet machine."""

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
    r"prefix_throughput_over_least_inflight=(\S+) lowreuse_p99_over_least_inflight=(\S+) "
    r"prefix_p90_ttft_over_rr_closed=(\S+) prefix_p90_ttft_over_session_closed=(\S+) "
    r"lowreuse_p99_over_least_inflight_closed=(\S+)$",
    re.M,
)
OPEN_TITLE = re.compile(
    r"^## workload (\w+): open loop, Poisson arrivals at ([\d.]+) req/s \(0\.5 of the lowest closed-loop "
    r"throughput, ([\w-]+)'s ([\d.]+)\)",
    re.M,
)
STRATEGIES = ("round-robin", "least-inflight", "session", "prefix", "prefix-approx")


def _tables(out: str) -> dict[str, str]:
    """Each table's text by its title's workload and phase ("prefix closed", "lowreuse open", ...)."""
    found = {}
    for block in out.split("\n## workload ")[1:]:
        title = re.match(r"(\w+): (closed|open) loop", block)
        assert title is not None, block
        found[" ".join(title.groups())] = block.split("\n\n")[0]
    return found


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_tiny_prefix_run_prints_closed_and_open_tables_and_the_prefix_fields() -> None:
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "scheduling.py"),
        "--workloads",
        "prefix,lowreuse",
        "--window",
        "3",
        "--seed",
        "7",
        "--open-fraction",
        "0.5",
        "--only",
        ",".join(STRATEGIES),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    tables = _tables(out)
    assert set(tables) == {"prefix closed", "prefix open", "lowreuse closed", "lowreuse open"}, out
    for name, table in tables.items():
        for strategy in STRATEGIES:
            assert re.search(rf"^{strategy} +[1-9]\d* +0 ", table, re.M), f"{name}, {strategy}:\n{out}"
    # the open loop's rate is the asked fraction of the lowest throughput any strategy reached closed-loop
    for workload, rate, lowest, lowest_rps in OPEN_TITLE.findall(out):
        closed_rps = {
            m[0]: float(m[1])
            for m in re.findall(
                r"^([\w-]+) +\d+ +\d+ +\S+ +\S+ +\S+ +([\d.]+) ", tables[f"{workload} closed"], re.M
            )
        }
        assert min(closed_rps.values()) == pytest.approx(float(lowest_rps), abs=0.05), (closed_rps, lowest)
        assert closed_rps[lowest] == pytest.approx(float(lowest_rps), abs=0.05)
        assert float(rate) == pytest.approx(0.5 * float(lowest_rps), abs=0.06)
    assert len(OPEN_TITLE.findall(out)) == 2, out
    match = FIELDS.search(out)
    assert match is not None, out
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in match.groups()), match.group(0)
