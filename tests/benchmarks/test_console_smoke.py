"""benchmarks/console.py at a tiny size, so its machinery (a controller with simulated nodes and replicas put
into its views, logins of both scopes, every page fetched) cannot rot. Speeds are not asserted: that every
page answered 200 and the table and the final line carry numbers are."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"^console: pages=(\d+) worst_ms=([0-9.]+) worst_kb=([0-9.]+) over_time=(\d+) over_size=(\d+)$", re.M
)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_tiny_run_fetches_every_page_and_prints_a_final_line() -> None:
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "console.py"),
        "--nodes",
        "12",
        "--models",
        "6",
        "--repeat",
        "1",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "12 nodes, 6 models, 6 replicas" in done.stdout
    final = FINAL.search(done.stdout)
    assert final is not None, done.stdout
    assert int(final.group(1)) == 12, "every page of the table was fetched"
    assert float(final.group(3)) > 0
    for page in ("/ui/nodes", "/ui/models", "/ui/plan", "/ui/tenants", "/ui/events", "/ui/nodes/node-0001"):
        assert re.search(rf"^{re.escape(page)} +[0-9.]+ +[0-9.]+", done.stdout, re.M), page
