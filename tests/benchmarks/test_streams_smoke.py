"""benchmarks/streams.py at a tiny size, so its machinery (the raw SSE mock, the raw-socket generator, the
process-tree RSS and CPU, each proxy in turn, the table and the final line) cannot rot. Speeds are not asserted."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"^streams: features=(?:keys\+limits3\+\S+) n=(\d+) kb_per_stream=(\S+) cpu_us_per_event=(\S+) floor_cpu_us_per_event=(\S+) "
    r"vllm_router_cpu_us_per_event=(\S+) added_p99_ms=(\S+) stalls=(\d+)$",
    re.M,
)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_tiny_run_serves_every_stream_through_each_proxy_and_ends_with_the_final_line() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "streams.py"), "--streams", "8", "--events", "3"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=220, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    targets = ["llmgw", "floor"] + ([] if "vLLM router skipped" in out else ["vllm-router"])
    for name in targets:
        # every stream ended with all its events, none failed, all 8 were open at once at some sample
        assert re.search(rf"^{name} +8 +0 +\d+ ", out, re.M), f"{name} did not serve all 8 streams:\n{out}"
    match = FINAL.search(out)
    assert match is not None, out
    assert out.rstrip().endswith(match.group(0))  # the machine-readable line is the last one
    assert int(match[1]) == 8
    assert math.isfinite(float(match[2]))  # may be negative at this size: RSS moves by pages
    for value in (match[3], match[4], match[6]):
        assert math.isfinite(float(value)) and float(value) >= 0, match.group(0)
    if "vllm-router" in targets:
        assert float(match[5]) >= 0
    else:
        assert match[5] == "none"
