"""benchmarks/autoscale.py at a tiny size, so its machinery (three real fleets: controller, agent, sim engines,
router; the step with and without the autoscaler; the preemption scenario on a node full of batch replicas;
the tables and the final line) cannot rot. Speeds are not asserted: counts, shapes and numbers are."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUM = r"([0-9]+(?:\.[0-9]+)?)"
FINAL = re.compile(
    r"^autoscale: first_replica_s=(\S+) p99_ttft_ratio=(\S+) refused_share=(\S+) fixed_refused_share=(\S+) "
    r"replica_seconds_over_ideal=(\S+) preempt_s=(\S+)$",
    re.M,
)


def row(out: str, name: str, columns: int = 1) -> list[str]:
    """The values of the table row called `name` (each a number), or a failure quoting the output."""
    pattern = rf"^{re.escape(name)} +" + " +".join([NUM] * columns) + " *$"
    found = re.search(pattern, out, re.M)
    assert found is not None, f"no row {name!r} with {columns} number(s):\n{out}"
    return list(found.groups())


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_tiny_run_prints_both_tables_and_a_final_line_with_numbers() -> None:
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "autoscale.py"),
        "--low",
        "2",
        "--high",
        "8",
        "--cooldown",
        "3",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout

    # The step, autoscaled and fixed: every request answered or refused, none failed otherwise.
    row(out, "p99 TTFT in the step (s)", 2)
    assert all(int(v) > 0 for v in row(out, "answered", 2))
    row(out, "refused (429/503)", 2)
    assert row(out, "failed otherwise", 2) == ["0", "0"]
    assert re.search(r"^replica-seconds \(ideal 52\) +\d+ +\d+ *$", out, re.M), out  # 2x2 s at 1, 8 s at 6

    # Preemption: the critical model served, exactly one batch replica yielded to it (its need is one core).
    served = float(row(out, "critical serves after its burst (s)")[0])
    assert int(row(out, "critical answered")[0]) >= 1
    assert row(out, "critical failed after serving") == ["0"]
    assert int(row(out, "batch answered")[0]) > 0
    assert row(out, "batch failed otherwise") == ["0"]
    assert row(out, "batch replicas (of 4)") == ["3"]
    assert row(out, "batch replicas preempted") == ["1"]
    assert re.search(
        r"^  yielded to critical after [0-9.]+s of its 10s grace; \d+ requests? cut", out, re.M
    ), out

    match = FINAL.search(out)
    assert match is not None, out
    assert out.rstrip().endswith(match.group(0))  # the machine-readable line is the last one
    first_replica, *numbers, preempt = match.groups()
    # A new replica may not be ready within a tiny 8 s step on a loaded machine: NA is then the truth.
    assert first_replica == "NA" or float(first_replica) >= 0, match.group(0)
    values = [float(v) for v in numbers]
    assert all(math.isfinite(v) and v >= 0 for v in values), match.group(0)
    assert values[1] <= 1 and values[2] <= 1  # shares
    assert float(preempt) == pytest.approx(served, abs=0.05)  # the table's figure, one decimal
