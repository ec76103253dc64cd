"""router_overhead reads every kind of failure wrk reports (not only timeouts and statuses), so a failed
request is named by what the client saw instead of vanishing from the count."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import router_overhead  # noqa: E402  (a script directory, not a package)

WRK_OUT = """Running 3s test @ http://127.0.0.1:1/v1/chat/completions
  2 threads and 64 connections
  10000 requests in 3.00s, 4.50MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 4
Requests/sec:   3333.33
"""


def test_every_kind_wrk_counts_is_a_failure_by_its_name() -> None:
    assert router_overhead.wrk_failures(WRK_OUT) == {"non-2xx": 4, "read": 2, "timeout": 3}
    text = router_overhead.failures_text(router_overhead.wrk_failures(WRK_OUT))
    assert "timeout 3: no answer within wrk's 2 s timeout" in text
    assert "read 2: the connection failed or closed while the answer was read" in text


def test_a_clean_run_has_no_failures() -> None:
    clean = "  10000 requests in 3.00s, 4.50MB read\nRequests/sec:   3333.33\n"
    assert router_overhead.wrk_failures(clean) == {}
