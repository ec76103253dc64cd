"""benchmarks/passthrough_overhead.py at a tiny size, so its machinery cannot rot. Speeds are not asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"^passthrough_overhead: tokens_per_s_direct=(\d+) tokens_per_s_through=(\d+) ratio=(\S+) "
    r"added_us_per_token=(\S+) cpu_us_per_token=(\S+)$",
    re.M,
)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_tiny_run_prints_a_final_line_with_numbers() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "passthrough_overhead.py")]
    argv += ["--concurrency", "2", "--tokens", "8", "--requests", "2", "--rounds", "1"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=100, check=True).stdout
    match = FINAL.search(out)
    assert match, out
    assert int(match[1]) > 0 and int(match[2]) > 0 and float(match[3]) > 0
