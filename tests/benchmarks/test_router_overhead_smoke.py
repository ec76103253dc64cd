"""benchmarks/router_overhead.py at a tiny size, so its machinery (wrk, the mock, the proxies and peers, the
process-tree CPU, the table and the final line) cannot rot. Speeds are not asserted."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"^router_overhead: features=(?:keys\+limits3\+\S+) added_p50_ms_c1=(\S+) rps_c16=(\d+) floor_rps_c16=(\d+) litellm_rps_c16=(\S+) "
    r"cpu_us_per_req_c16=(\d+) floor_cpu_us_per_req_c16=(\d+) vllm_router_rps_c16=(\S+) portkey_rps_c16=(\S+) "
    r"p99_ms_c64=(\S+) floor_p99_ms_c64=(\S+)$",
    re.M,
)


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_tiny_run_measures_each_target_and_ends_with_the_final_line() -> None:
    # LiteLLM is left out: its proxy takes tens of seconds to start and is measured by hand.
    argv = [sys.executable, str(ROOT / "benchmarks" / "router_overhead.py")]
    argv += ["--duration", "1", "--concurrency", "1,16", "--peers", "vllm,portkey"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    served = ["direct", "floor", "llmgw", "llmgw-tchat", "llmgw-resp", "llmgw-cmiss", "llmgw-chit"]
    served += [] if "vLLM router skipped" in out else ["vllm-router"]
    portkey = "Portkey skipped" not in out
    for name in served:
        for mode in ("whole", "stream"):
            # a row with requests per second above 0 and no errors; a proxy's row has its CPU per request
            row = re.search(rf"^{mode} +{name} +16 +\S+ +\S+ +\S+ +\S+ +(\d+) +(\S+) +(\d+)$", out, re.M)
            assert row is not None, f"no {mode} row for {name}:\n{out}"
            assert int(row[1]) > 0 and int(row[3]) == 0, row.group(0)
            assert (row[2] == "-") == (name == "direct"), row.group(0)
    if portkey:  # its streaming may fail on this Node (see docs/router.md); whole requests must not
        assert re.search(r"^whole +portkey +16 +\S+ +\S+ +\S+ +\S+ +[1-9]\d* +\d+ +0$", out, re.M), out
    messages = re.search(
        r"^router_overhead_messages: whole cpu_us_per_req_c16=(\d+) chat_cpu_us_per_req_c16=(\d+) "
        r"stream cpu_us_per_req_c16=(\d+) chat_cpu_us_per_req_c16=(\d+)$",
        out,
        re.M,
    )
    assert messages is not None and all(int(v) > 0 for v in messages.groups()), out
    for mode in ("whole", "stream"):  # llmgw on /v1/messages served every request (the last column: errors)
        assert re.search(rf"^{mode} +[1-9]\d* +\d+ +\d+ +\d+ +0$", out, re.M), out
    cache = re.search(r"^router_overhead_cache: (.*)$", out, re.M)  # a miss's cost and a hit's latency
    assert cache is not None and "hit_p50_ms_whole_c16=" in cache[1] and "none" not in cache[1], out
    # The machine's bound beside llmgw's and the floor's req/s: cores / (proxy + wrk + mock CPU) per request.
    bound = re.search(
        r"^router_overhead_bound: cores=\d+ "
        + " ".join(
            rf"{n}_rps_c16=(\d+) {n}_cpu_us=(\d+) {n}_load_cpu_us=(\d+) {n}_bound_rps_c16=(\d+)"
            for n in ("llmgw", "floor")
        )
        + "$",
        out,
        re.M,
    )
    assert bound is not None and all(int(v) > 0 for v in bound.groups()), out
    match = FINAL.search(out)
    assert match is not None, out
    assert out.rstrip().endswith(match.group(0))
    assert math.isfinite(float(match[1])) and int(match[2]) > 0 and int(match[3]) > 0
    assert match[4] == "none"  # not asked for
    assert int(match[5]) > 0 and int(match[6]) > 0
    assert (match[7] == "none") == ("vllm-router" not in served)
    assert (match[8] == "none") == (not portkey)
    assert match[9] == match[10] == "none"  # no run at concurrency 64


TRACING = re.compile(
    r"^router_tracing: cpu_ratio_off_c16=(\S+) cpu_ratio_on_c16=(\S+) rps_ratio_off_c16=(\S+) "
    r"rps_ratio_on_c16=(\S+)$",
    re.M,
)


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_tiny_tracing_comparison_measures_the_three_builds() -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the llmgw[tracing] extra is not installed")
    argv = [sys.executable, str(ROOT / "benchmarks" / "router_overhead.py")]
    argv += ["--tracing", "--duration", "1", "--concurrency", "16", "--rounds", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for build in ("without", "off", "on"):
        for mode in ("whole", "stream"):
            row = re.search(rf"^{mode} +{build} +16 +(\d+) +(\d+) ", out, re.M)
            assert row is not None and int(row[1]) > 0 and int(row[2]) > 0, (
                f"no {mode} row for {build}:\n{out}"
            )
    assert "requests failed" not in out, out
    match = TRACING.search(out)
    assert match is not None and out.rstrip().endswith(match.group(0)), out
    assert all(math.isfinite(float(x)) and float(x) > 0 for x in match.groups())
