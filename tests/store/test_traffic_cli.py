"""`llmgw traffic export` and `import` through the CLI on a real store: a round trip keeps every request's
shape, bad lines are skipped and named, a trace that is not one is refused, and `llmgw usage --by router`
tells imported rows from recorded ones."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.core.traffic.trace import parse_trace
from llmgw.store import Store, UsageRecord

runner = CliRunner(env={"COLUMNS": "200"})


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


async def _seed(dsn: str, now: float) -> None:
    store = await Store.open(dsn)
    try:
        await store.insert_usage(
            [
                UsageRecord(
                    time=now - 3600,
                    request_id="a",
                    project="web",
                    model="chat",
                    status=200,
                    tokens_in=12,
                    tokens_out=30,
                    latency_ms=900.0,
                    ttft_ms=80.0,
                    stream=True,
                    prefix="f" * 24,
                    router_id="router-1",
                ),
                UsageRecord(
                    time=now - 1800,
                    request_id="b",
                    project="batch",
                    model="chat",
                    status=429,
                    latency_ms=2.0,
                    stream=False,
                    router_id="router-1",
                ),
                UsageRecord(
                    time=now - 9 * 86400,
                    request_id="c",
                    project="web",
                    model="chat",
                    status=200,
                    router_id="router-1",
                ),
            ]
        )
    finally:
        await store.close()


def test_export_then_import_keeps_every_shape(store_dsn: str, tmp_path: Path) -> None:
    now = time.time()
    asyncio.run(_seed(store_dsn, now))
    out = tmp_path / "week.jsonl"
    code, _, err = invoke("traffic", "export", "--since", "7d", "-o", str(out), "--store", store_dsn)
    assert code == 0 and "wrote 2 requests" in err
    exported = parse_trace(out.read_text().splitlines())
    assert [(r.project, r.status, r.stream, r.prefix) for r in exported.requests] == [
        ("web", 200, True, "f" * 24),
        ("batch", 429, False, None),
    ]
    code, only, _ = invoke("traffic", "export", "--since", "7d", "--project", "batch", "--store", store_dsn)
    assert code == 0 and [r.project for r in parse_trace(only.splitlines()).requests] == ["batch"]

    target = f"sqlite:///{tmp_path / 'other.db'}"
    code, _, err = invoke("traffic", "import", str(out), "--source", "prod-week", "--store", target)
    assert code == 0 and "imported 2 requests" in err, err
    code, back, _ = invoke("traffic", "export", "--since", "7d", "--store", target)
    again = parse_trace(back.splitlines())
    # Each export starts 7 days before it ran: compare arrivals as times, the rest as it is.
    arrivals = [pytest.approx(trace.header.start + r.t) for trace in (exported,) for r in trace.requests]
    assert [again.header.start + r.t for r in again.requests] == arrivals
    assert [replace(r, t=0) for r in again.requests] == [replace(r, t=0) for r in exported.requests]
    code, report, _ = invoke("usage", "--by", "router", "--json", "--store", target)
    assert {r["router"]: r["requests"] for r in json.loads(report)} == {"import:prod-week": 2}


def test_bad_lines_are_named_and_a_non_trace_refused(store_dsn: str, tmp_path: Path) -> None:
    trace = tmp_path / "hand.jsonl"
    good = {"t": 1.5, "model": "chat", "project": "web", "prompt_tokens": 3, "completion_tokens": 4}
    trace.write_text(
        "\n".join(
            [
                json.dumps({"llmgw_trace": 1, "start": 1_800_000_000, "duration_s": 60}),
                json.dumps(good),
                "{not json",
                json.dumps({**good, "prompt_tokens": -1}),
            ]
        )
    )
    code, _, err = invoke("traffic", "import", str(trace), "--store", store_dsn)
    assert code == 0
    assert "line 3: not JSON" in err and "line 4: prompt_tokens must be a whole number at or above 0" in err
    assert "imported 1 requests from" in err and "2 lines skipped" in err
    code, _, err = invoke("traffic", "import", str(trace), "--store", store_dsn)
    assert "imported 0 requests" in err and "1 were already imported" in err

    trace.write_text(json.dumps({"llmgw_trace": 2}) + "\n")
    code, _, err = invoke("traffic", "import", str(trace), "--store", store_dsn)
    assert code == 1 and "line 1: not an llmgw trace of version 1 (llmgw_trace is 2)" in err
    code, _, err = invoke("traffic", "export", "--since", "soon", "--store", store_dsn)
    assert code == 1 and "--since: not a duration" in err


def test_a_synthetic_trace_lands_where_it_is_asked_to(store_dsn: str, tmp_path: Path) -> None:
    trace = tmp_path / "synthetic.jsonl"
    request = {"t": 30.0, "model": "chat", "project": "web", "prompt_tokens": 1, "completion_tokens": 1}
    trace.write_text(
        json.dumps({"llmgw_trace": 1, "start": 0, "duration_s": 60}) + "\n" + json.dumps(request)
    )
    before = time.time()
    code, _, err = invoke("traffic", "import", str(trace), "--ends-now", "--store", store_dsn)
    assert code == 0, err
    code, out, _ = invoke("traffic", "export", "--since", "1h", "--store", store_dsn)
    [landed] = parse_trace(out.splitlines()).requests
    header = parse_trace(out.splitlines()).header
    assert before - 30 - 1 <= header.start + landed.t <= time.time() - 30, "30 s into a window ending now"
