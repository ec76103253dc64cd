"""`llmgw-router --workers 2` as real processes: both workers serve the one API port, the parent's /metrics is
the sum of the workers' own pages, a worker killed with -9 is logged once and started again without the
summed counters going backwards, SIGTERM stops them all; a project's rpm holds exactly over both workers (its
limit answered, the rest refused, and the parent's page sums both kinds); and more than one worker without a
store is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from faults.procs import RouterProc, start_router_proc
from support import pid_alive, wait_until
from tenancy.helpers import create_key, in_one_window, window_start_offset

from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

MODEL = "sim-chat"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    s = start_sim(MODEL, "engine-key", concurrency=32)
    try:
        wait_healthy_sync([s])
        yield s
    finally:
        s.kill()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
        return [int(p) for p in f.read().split()]


def _listening_ports(pid: int) -> set[int]:
    """Loopback TCP ports process `pid` listens on (its socket inodes matched against /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
            ports.add(int(cols[1].split(":")[1], 16))
    return ports


def _requests_total(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmgw_router_requests_total{") and f'model="{MODEL}"' in line
    )


def _ask(router: RouterProc, key: str, n: int) -> None:
    # A fresh client (and connection) per request, so the kernel spreads them over the workers.
    for _ in range(n):
        with router.client(key) as client:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )


def _start(
    tmp: Path, sim: SimProcess, dsn: str, rpm: int | None = None, clock_offset: float = 0.0
) -> RouterProc:
    project: dict[str, Any] = {"organization": "o", **({"limits": {"rpm": rpm}} if rpm else {})}
    snap = {
        "revision": "w-1",
        "models": {MODEL: {"context_length": 4096}},
        "endpoints": [endpoint(sim, "s-0")],
        "tenants": {"organizations": {"o": {}}, "projects": {"p": project}},
    }
    (tmp / "snap.json").write_text(json.dumps(snap))
    args = [
        "--snapshot",
        str(tmp / "snap.json"),
        "--store",
        dsn,
        "--workers",
        "2",
        "--router-id",
        "w",
        "--state-dir",
        str(tmp / "state"),
        "--limits-clock-offset",
        repr(clock_offset),
    ]
    return start_router_proc(tmp / "router.log", args)


def _statuses(url: str) -> dict[str, float]:
    """The page's llmgw_router_requests_total for MODEL, by status."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llmgw_router_requests_total{") and f'model="{MODEL}"' in line:
            status = line.split('status="', 1)[1].split('"', 1)[0]
            out[status] = out.get(status, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _ask_counting(router: RouterProc, key: str, n: int) -> dict[int, int]:
    """`n` chats, each on a fresh connection (spread over the workers by the kernel): how many got each status."""
    got: dict[int, int] = {}
    for _ in range(n):
        with router.client(key) as client:
            try:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                status = 200
            except openai.RateLimitError as exc:
                status = exc.status_code
        got[status] = got.get(status, 0) + 1
    return got


def test_an_rpm_limit_holds_exactly_over_two_workers_and_the_page_sums_both_kinds(
    sim: SimProcess, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path / 'llmgw.db'}"
    key = create_key(dsn, "p")
    offset = window_start_offset()  # a whole minute window from the start: the pool is not renewed meanwhile
    router = _start(tmp_path, sim, dsn, rpm=20, clock_offset=offset)
    try:
        workers = wait_until(
            lambda: len(_children(router.pid)) == 2 and _children(router.pid), 30, "2 workers"
        )
        got = in_one_window(offset, lambda: _ask_counting(router, key, 40))
        assert got == {200: 20, 429: 20}, got
        api_port = int(router.api.rsplit(":", 1)[1])
        private = [next(p for p in _listening_ports(pid) if p != api_port) for pid in workers]
        each = [_statuses(f"http://127.0.0.1:{port}") for port in private]
        assert all(e.get("200", 0) > 0 for e in each), f"one worker answered every admitted request: {each}"
        assert _statuses(router.metrics) == {"200": 20.0, "429": 20.0}
        assert [sum(e.get(s, 0.0) for e in each) for s in ("200", "429")] == [20.0, 20.0]
    finally:
        assert router.stop() == 0, router.text()[-3000:]


def test_workers_share_the_port_sum_their_metrics_and_come_back(sim: SimProcess, tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'llmgw.db'}"
    key = create_key(dsn, "p")
    router = _start(tmp_path, sim, dsn)
    try:
        workers = wait_until(
            lambda: len(_children(router.pid)) == 2 and _children(router.pid), 30, "2 workers"
        )
        _ask(router, key, 40)
        own = {pid: _listening_ports(pid) for pid in workers}
        api_port = int(router.api.rsplit(":", 1)[1])
        assert all(api_port in ports for ports in own.values()), "each worker listens on the API port itself"
        private = {pid: [p for p in ports if p != api_port] for pid, ports in own.items()}
        assert all(len(p) == 1 for p in private.values()), private
        each = {pid: _requests_total(f"http://127.0.0.1:{p[0]}") for pid, p in private.items()}
        assert all(n > 0 for n in each.values()), f"the kernel gave one worker everything: {each}"
        assert _requests_total(router.metrics) == sum(each.values()) == 40

        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: not pid_alive(victim), 10, "the killed worker gone")
        again = wait_until(
            lambda: len(_children(router.pid)) == 2 and victim not in _children(router.pid),
            30,
            "a new worker",
        )
        assert again
        wait_until(lambda: "2 workers" in router.text() and _metrics_workers(router) == 2, 30, "2 serving")
        assert router.text().count("exited with signal SIGKILL") == 1, router.text()[-2000:]
        # What the killed worker had counted stays in the sum (the parent scraped it above).
        assert _requests_total(router.metrics) >= 40
        _ask(router, key, 10)
        assert _requests_total(router.metrics) >= 50
    finally:
        status = router.stop()
    assert status == 0, router.text()[-3000:]
    assert not any(pid_alive(pid) for pid in workers), "a worker outlived its parent's SIGTERM"


def _metrics_workers(router: RouterProc) -> float:
    with urllib.request.urlopen(router.metrics + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("llmgw_router_workers "):
                return float(line.split()[1])
    return 0.0


def test_more_than_one_worker_without_a_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "snap.json").write_text(json.dumps({"revision": "w-1"}))
    argv = [
        sys.executable,
        "-m",
        "llmgw_router",
        "--snapshot",
        str(tmp_path / "snap.json"),
        "--no-auth",
        "--workers",
        "2",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "2 workers need --store DSN" in done.stderr and "N times" in done.stderr, done.stderr
