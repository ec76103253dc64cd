"""benchmarks/engine_overhead.py at a tiny size (both real engines, llmgw in front, the pairing, the final line), so
its machinery cannot rot. Speeds are not asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.llama import require_llama

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"(-?[0-9.e+-]+)"
FINAL = re.compile(
    rf"^engine_overhead: vllm_added_p50_ttft_ms_c1={NUMBER} vllm_throughput_ratio_c16={NUMBER} "
    rf"vllm_stream_ratio_c16={NUMBER} llamacpp_added_p50_ttft_ms_c1={NUMBER} "
    rf"llamacpp_throughput_ratio_c16={NUMBER} llamacpp_stream_ratio_c16={NUMBER}$",
    re.M,
)

# With the vLLM tests (tests/vllm_real): one vLLM at a time beside them, never three.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.llamacpp,
    pytest.mark.vllm,
    pytest.mark.xdist_group("vllm"),
    pytest.mark.timeout(600),
]


def test_tiny_pinned_run_measures_both_engines_and_ends_with_the_final_line(vllm_python: str) -> None:
    # Pinned (engine and pass-through on CPU 0, router and clients on CPU 1): the placement the record is
    # taken with; unpinned differs only by starting the same processes without taskset.
    _, gguf = require_llama()
    argv = [sys.executable, str(ROOT / "benchmarks" / "engine_overhead.py"), "--pairs", "2", "--rounds", "1"]
    argv += ["--requests", "4", "--pin", "--vllm-python", vllm_python, "--gguf", gguf]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=580, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = FINAL.search(done.stdout)
    assert found is not None, done.stdout[-3000:]
    ratios = [float(found.group(i)) for i in (2, 3, 5, 6)]
    assert all(r > 0 for r in ratios), found.group(0)  # every way answered and was timed
    for engine in ("vllm", "llamacpp"):
        times = rf"^{engine}: c=1 TTFT straight p50 \S+ ms, added p50 "
        spread = r"; whole rounds \S+ \.\. \S+, streamed rounds \S+ \.\. \S+$"
        assert re.search(times + ".*" + spread, done.stdout, re.M), done.stdout
