"""Slots free when the answer ends (issue 37): a client keeping exactly its limit in flight is never refused.

A real `llmgw-router --workers 2` over a real store (SQLite, and PostgreSQL under the `postgres` marker), a
tenant chain whose organization, team and project each allow 16 concurrent requests, and a client that keeps
exactly 16 in flight: waves of 16 at once, each wave started only when every answer of the one before was read
to its last byte, then 16 lanes in a closed loop, each sending its next request as soon as it read the end of
its last answer; streamed and not, every request on a fresh connection (so the kernel spreads the requests over
the two workers anew, and a slot freed in one worker is needed in the other). Not one request may be refused.
On the code before issue 37's fix some always were (the slot stayed held, idle, in the worker that served it).

One router without a store or workers is held to the same rule: there the slot must be free before the next
request is admitted in the same process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from faults.procs import FakeEngine, RouterProc, start_router_proc
from tenancy.helpers import create_key

pytestmark = pytest.mark.integration

MODEL = "waves"
LIMIT = 16
WAVES = 40  # half streamed, half not
LOOP_TURNS = 40  # requests per lane of the closed loop, streamed and not in turn
WAVE_LIMIT_S = 60.0  # one wave's answers, read whole: a deadline, not a pace


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("o", "k"):
            chunk = {
                "id": "w",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": MODEL,
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {
            "id": "w",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp
    return web.json_response(
        {
            "id": "w",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }
    )


async def _metrics(request: web.Request) -> web.StreamResponse:
    return web.Response(
        text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.0\n"
    )


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine()
    fake.behave["/v1/chat/completions"] = _chat
    fake.behave["/metrics"] = _metrics
    fake.start()
    yield fake
    fake.stop()


def _snapshot(tmp: Path, engine: FakeEngine) -> Path:
    limits = {"concurrency": LIMIT}
    snap = {
        "revision": "waves-1",
        "models": {MODEL: {"context_length": 4096}},
        "tenants": {
            "organizations": {"acme": {"limits": limits}},
            "teams": {"research": {"organization": "acme", "limits": limits}},
            "projects": {"playground": {"team": "research", "limits": limits}},
        },
        "endpoints": [
            {
                "replica_id": "waves-0",
                "model": MODEL,
                "engine": "vllm",
                "slots": 4 * LIMIT,
                "base_url": engine.base_url,
                "api_key": "engine-key",
            }
        ],
    }
    path = tmp / "snap.json"
    path.write_text(json.dumps(snap))
    return path


async def _one(session: aiohttp.ClientSession, url: str, key: str, stream: bool) -> tuple[int, str]:
    """One request, its answer read to the last byte: (status, what it said)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        text = await resp.text()
    if resp.status == 200 and stream:
        assert text.rstrip().endswith("data: [DONE]"), text[-300:]
    return resp.status, text


async def _waves(url: str, key: str) -> Counter[tuple[int, str]]:
    """WAVES waves of LIMIT requests at once, a wave started when every answer of the previous one was read;
    then LIMIT lanes in a closed loop, each sending its next request as soon as it read its last answer."""
    outcomes: Counter[tuple[int, str]] = Counter()

    def note(status: int, text: str) -> None:
        outcomes[(status, "" if status == 200 else text[:300])] += 1

    async def lane(session: aiohttp.ClientSession, index: int) -> None:
        for turn in range(LOOP_TURNS):
            note(*await _one(session, url, key, (index + turn) % 2 == 0))

    # A fresh connection per request: each request goes to whichever worker the kernel picks.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for wave in range(WAVES):
            async with asyncio.timeout(WAVE_LIMIT_S):
                answers = await asyncio.gather(
                    *(_one(session, url, key, wave % 2 == 1) for _ in range(LIMIT))
                )
            for status, text in answers:
                note(status, text)
        async with asyncio.timeout(WAVE_LIMIT_S * 2):
            await asyncio.gather(*(lane(session, i) for i in range(LIMIT)))
    return outcomes


def _run_waves(router: RouterProc, key: str) -> None:
    outcomes = asyncio.run(_waves(router.api, key))
    refused = {k: n for k, n in outcomes.items() if k[0] != 200}
    assert not refused, f"a client at exactly its limit was refused: {refused}"
    assert outcomes[(200, "")] == (WAVES + LOOP_TURNS) * LIMIT


def test_waves_at_the_limit_over_two_workers_are_never_refused(
    tmp_path: Path, engine: FakeEngine, store_dsn: str
) -> None:
    key = create_key(store_dsn, "playground")
    args = [
        "--snapshot",
        str(_snapshot(tmp_path, engine)),
        "--store",
        store_dsn,
        "--workers",
        "2",
        "--router-id",
        "waves",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    router = start_router_proc(tmp_path / "router.log", args)
    try:
        _run_waves(router, key)
    finally:
        assert router.stop() == 0, router.text()[-3000:]
    assert "Traceback" not in router.text(), router.text()[-3000:]


def test_waves_at_the_limit_on_one_router_without_a_store_are_never_refused(
    tmp_path: Path, engine: FakeEngine
) -> None:
    key = "sk-waves-key"
    keys = tmp_path / "keys"
    keys.write_text(f"{hashlib.sha256(key.encode()).hexdigest()} playground\n")
    args = [
        "--snapshot",
        str(_snapshot(tmp_path, engine)),
        "--keys-file",
        str(keys),
        "--state-dir",
        str(tmp_path / "state"),
    ]
    router = start_router_proc(tmp_path / "router.log", args)
    try:
        _run_waves(router, key)
    finally:
        assert router.stop() == 0, router.text()[-3000:]
