"""Traffic shapes recorded by a real router process into a real store, then exported as a trace by the CLI:
whether each request streamed, and a salted per-project hash of its prefix, never its content."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from llmgw_router.decisions.rules import conversation_key
from support import wait_until

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.traffic.recorded import prefix_hash
from llmgw.core.traffic.trace import parse_trace
from llmgw.store import Store, UsageRecord

from .helpers import FAST, cli, create_key, start_router

pytestmark = pytest.mark.integration

SALT = "0123456789abcdef" * 4


async def _rows(dsn: str) -> list[UsageRecord]:
    store = await Store.open(dsn)
    try:
        return await store.list_usage()
    finally:
        await store.close()


def _all_written(dsn: str, count: int) -> list[UsageRecord] | None:
    rows = asyncio.run(_rows(dsn))
    return rows if len(rows) == count else None


def test_the_router_records_stream_and_a_salted_prefix_hash(
    store_dsn: str, snap: dict[str, Any], tmp_path: Path
) -> None:
    keys = {project: create_key(store_dsn, project) for project in ("keys", "usage")}
    router = start_router(tmp_path, snap | {"trace_salt": SALT}, store_dsn)
    same = [{"role": "user", "content": "the secret recipe"}]
    try:
        with router.client(keys["usage"]) as client:
            client.chat.completions.create(model=FAST, messages=same, max_tokens=2)  # type: ignore[arg-type]
            stream = client.chat.completions.create(model=FAST, messages=same, max_tokens=2, stream=True)  # type: ignore[arg-type]
            assert sum(1 for _ in stream) > 0
            client.chat.completions.create(
                model=FAST, messages=[{"role": "user", "content": "other"}], max_tokens=1
            )
        with router.client(keys["keys"]) as client:
            client.chat.completions.create(model=FAST, messages=same, max_tokens=2)  # type: ignore[arg-type]
        rows = wait_until(lambda: _all_written(store_dsn, 4), 30, "4 usage rows")
    finally:
        assert router.stop() == 0, router.text()[-3000:]
    by_order = sorted(rows, key=lambda r: r.time)
    usage_plain, usage_stream, usage_other, keys_plain = by_order
    assert [r.stream for r in by_order] == [False, True, False, False]
    assert usage_plain.prefix is not None and usage_plain.prefix == usage_stream.prefix, (
        "one prefix, one hash"
    )
    assert usage_other.prefix not in (None, usage_plain.prefix)
    assert keys_plain.prefix not in (None, usage_plain.prefix), "two projects' hashes never match"
    key = conversation_key({}, {"messages": same}, RoutingPolicySpec())
    assert key is not None
    assert usage_plain.prefix == prefix_hash(SALT.encode(), "usage", key), "the controller's salt is used"
    stored = json.dumps([r.prefix for r in rows])
    assert "secret" not in stored and "recipe" not in stored

    out = tmp_path / "trace.jsonl"
    cli("traffic", "export", "--since", "1h", "--project", "usage", "-o", str(out), "--store", store_dsn)
    trace = parse_trace(out.read_text().splitlines())
    assert trace.skipped == ()
    assert [(r.project, r.stream, r.prefix) for r in trace.requests] == [
        ("usage", False, usage_plain.prefix),
        ("usage", True, usage_plain.prefix),
        ("usage", False, usage_other.prefix),
    ]
    assert "secret" not in out.read_text()
    assert trace.requests[1].ttft_ms is not None and trace.requests[0].ttft_ms is None


def test_a_request_refused_by_its_limits_has_a_shape_too(
    store_dsn: str, snap: dict[str, Any], tmp_path: Path
) -> None:
    key = create_key(store_dsn, "rpm")  # 5 requests a minute
    router = start_router(tmp_path, snap | {"trace_salt": SALT}, store_dsn)
    messages = [{"role": "user", "content": "again"}]
    try:
        with router.client(key) as client:
            for _ in range(5):
                client.chat.completions.create(model=FAST, messages=messages, max_tokens=1)  # type: ignore[arg-type]
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(model=FAST, messages=messages, max_tokens=1, stream=True)  # type: ignore[arg-type]
        rows = wait_until(lambda: _all_written(store_dsn, 6), 30, "6 usage rows")
    finally:
        assert router.stop() == 0, router.text()[-3000:]
    [refused] = [r for r in rows if r.status == 429]
    assert refused.stream is True
    assert refused.prefix is not None and {r.prefix for r in rows} == {refused.prefix}
