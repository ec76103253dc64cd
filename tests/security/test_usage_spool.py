"""L1: usage survives a router killed with SIGKILL; a 200 without `usage` is charged its estimate.

The bound, stated precisely: a router records a request's usage (one write(2) to its spool) right after it
has sent the answer, in the same run of the event loop. So a SIGKILL can lose only records of requests
whose answer was already sent and whose record was not yet written — at most one per request in flight on
that router at the instant of the kill, never a whole flush interval. The converse (a record written for an
answer the client then lost in the reset) is bounded the same way. Here each killed router has at most
CLIENTS requests in flight, so per kill the store may differ from the answered count by at most CLIENTS.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from faults.procs import FakeEngine, http_status
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync
from support import free_port, wait_until
from tenancy.helpers import create_key, usage_rows

from llmgw.store.usage.usage_spool import UsageSpool

CLIENTS = 3  # client threads per router: the most requests a killed router can have in flight
PROJECT = "spool"


def _snapshot(sim: SimProcess, provider: FakeEngine) -> dict[str, Any]:
    model = {"context_length": 8192, "capabilities": ["chat", "completions"], "simulated": True}
    prices = {"input_per_million": 1_000_000.0, "output_per_million": 1_000_000.0}  # a unit per token
    return {
        "revision": "spool-1",
        "models": {
            sim.model: {**model, "prices": prices},
            "bare": {
                "context_length": 8192,
                "prices": prices,
                "provider": {"url": provider.base_url + "/v1", "model": "up"},
            },
        },
        "tenants": {
            "organizations": {"acme": {}},
            "teams": {"research": {"organization": "acme"}},
            "projects": {PROJECT: {"team": "research"}, "bare": {"team": "research"}},
        },
        "endpoints": [endpoint(sim, "sim-0", slots=16)],
    }


@dataclass
class Router:
    tmp: Path
    name: str
    dsn: str
    flush_interval: float
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    def start(self) -> Router:
        """`llmgw-router --store DSN` with its own state dir (the spool); the same dir on every restart."""
        self.port = free_port()
        log = (self.tmp / f"{self.name}.log").open("ab")
        argv = [
            sys.executable,
            "-m",
            "llmgw_router",
            "--snapshot",
            str(self.tmp / "snapshot.json"),
            "--store",
            self.dsn,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--metrics-listen",
            f"127.0.0.1:{free_port()}",
            "--router-id",
            self.name,
            "--state-dir",
            str(self.tmp / f"{self.name}-state"),
            "--usage-flush-interval",
            str(self.flush_interval),
        ]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(
            lambda: (
                http_status(f"http://127.0.0.1:{self.port}/health") == 200 or self.proc.poll() is not None
            ),
            60,
            f"{self.name} /health",
        )
        assert self.proc.poll() is None, (self.tmp / f"{self.name}.log").read_text()[-3000:]
        return self

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0, timeout=30
        )

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


@dataclass
class Load:
    """CLIENTS threads sending chat requests through the official client until the router dies."""

    router: Router
    key: str
    model: str
    answered: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def _run(self) -> None:
        client = self.router.client(self.key)
        for _ in range(2000):  # bounded; ends far sooner, when the router is killed
            if self.stop.is_set():
                return
            try:
                client.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            except (openai.APIConnectionError, openai.APIStatusError):
                return  # the router is gone
            with self.lock:
                self.answered += 1

    def start(self) -> Load:
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]
        for t in self.threads:
            t.start()
        return self

    def join(self) -> int:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return self.answered


def _stored(dsn: str, project: str) -> int:
    row = usage_rows(dsn).get(project)
    return int(row["requests"]) if row else 0


@pytest.mark.postgres
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_l1_sigkilled_routers_lose_no_answered_usage(tmp_path: Path, pg_dsn: str) -> None:
    sim = start_sim("sim-chat", "engine-key", decode_ms=1.0, concurrency=16)
    provider = FakeEngine().start()
    try:
        wait_healthy_sync([sim])
        (tmp_path / "snapshot.json").write_text(json.dumps(_snapshot(sim, provider)))
        key = create_key(pg_dsn, PROJECT)
        # r-fast flushes often: at the kill most of its records are in the store and still in its spool
        # (replayed, and not counted twice). r-slow would flush after 60 s: at the kill nothing of it is in
        # the store, so all its usage must come back from the spool.
        routers = [Router(tmp_path, "r-fast", pg_dsn, 0.2), Router(tmp_path, "r-slow", pg_dsn, 60.0)]
        answered = 0
        for life in range(2):  # each router is killed twice, under load, and restarted on its spool
            for r in routers:
                r.start()
            loads = [Load(r, key, sim.model).start() for r in routers]
            wait_until(
                lambda ls=loads: all(x.answered >= 30 for x in ls), 120, f"load on both routers ({life})"
            )
            for r in routers:
                r.stop(signal.SIGKILL)
            answered += sum(x.join() for x in loads)
        kills = 2 * len(routers)
        for r in routers:
            r.start()  # drains what the last kill left
        try:
            wait_until(
                lambda: abs(_stored(pg_dsn, PROJECT) - answered) <= CLIENTS * kills, 60, "the spools drained"
            )
            assert answered >= 30 * kills
            for r in routers:  # a clean stop leaves no segment behind: the store has every record
                r.stop()
                spool = tmp_path / f"{r.name}-state" / "usage-spool" / r.name
                assert not list(spool.glob("usage-*.jsonl")), list(spool.iterdir())
            stored = _stored(pg_dsn, PROJECT)
            assert abs(stored - answered) <= CLIENTS * kills, (stored, answered)
        finally:
            for r in routers:
                r.stop(signal.SIGKILL)
    finally:
        provider.stop()
        sim.kill()


async def _no_usage(request: web.Request) -> web.StreamResponse:
    return web.json_response(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "up",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            ],
        }
    )


@pytest.mark.postgres
@pytest.mark.integration
def test_l1_an_answer_without_usage_is_charged_its_estimate(tmp_path: Path, pg_dsn: str) -> None:
    sim = start_sim("sim-chat", "engine-key", decode_ms=1.0)
    provider = FakeEngine(behave={"/v1/chat/completions": _no_usage}).start()
    router = None
    try:
        wait_healthy_sync([sim])
        (tmp_path / "snapshot.json").write_text(json.dumps(_snapshot(sim, provider)))
        key = create_key(pg_dsn, "bare")
        router = Router(tmp_path, "r-bare", pg_dsn, 0.2).start()
        reply = router.client(key).chat.completions.create(
            model="bare", messages=[{"role": "user", "content": "x" * 400}], max_tokens=50
        )
        assert reply.usage is None  # the provider sent none
        router.stop()
        row = usage_rows(pg_dsn)["bare"]
        assert row["requests"] == 1
        # The estimate reserved at admission: the prompt's (from its size, > 0) and the 50 asked for.
        assert row["tokens_out"] == 50 and row["tokens_in"] > 0, row
        assert row["cost"] == row["tokens_in"] + row["tokens_out"]  # one unit per token
    finally:
        if router is not None:
            router.stop(signal.SIGKILL)
        provider.stop()
        sim.kill()


def test_l1_spool_replays_what_a_killed_writer_left_and_tolerates_a_cut_line(tmp_path: Path) -> None:
    from llmgw.store.records import UsageRecord

    spool = UsageSpool(tmp_path)
    assert spool.open() == []
    recs = [
        UsageRecord(time=1.0 + i, request_id=f"r{i}", project="p", model="m", status=200) for i in range(3)
    ]
    for rec in recs:
        spool.append(rec)
    # Killed: no close. A second spool on the same directory is refused while the first holds it.
    other = UsageSpool(tmp_path)
    with pytest.raises(Exception, match="held by another router"):
        other.open()
    assert spool._lock is not None
    spool._lock.close()  # what the process's death does
    with (tmp_path / "usage-000000000001.jsonl").open("ab") as fh:
        fh.write(b'{"time": 4.0, "request_id": "cut')  # a power loss mid-line
    again = UsageSpool(tmp_path)
    left = again.open()
    assert [r for r, _ in left] == recs and {seq for _, seq in left} == {1}
    again.close(everything_written=True)
    assert not list(tmp_path.glob("usage-*.jsonl"))
