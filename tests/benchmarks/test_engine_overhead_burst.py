"""engine_overhead.py's c=16 rounds count every completion token their workers got: a burst's tokens/s is the
throughput ratio's numerator and denominator. Until 2026-12-07 the workers added to one total across an await
and lost each other's tokens, so a burst counted a fraction of what it got and the ratios were noise."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_overhead import burst_tokens  # noqa: E402
from peers import Target  # noqa: E402

TOKENS = 16  # each answer's completion tokens


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    usage = {"prompt_tokens": 5, "completion_tokens": TOKENS, "total_tokens": 5 + TOKENS}
    if not body.get("stream"):
        return web.json_response({"choices": [{"message": {"content": "x"}}], "usage": usage})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunk = {"choices": [{"delta": {"content": "x"}}], "usage": None}
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _count(stream: bool, requests: int, workers: int) -> int:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            target = Target("fake", f"http://127.0.0.1:{port}", {})
            tokens, seconds = await burst_tokens(http, target, stream, requests, workers)
            assert seconds > 0
            return tokens
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_burst_counts_every_workers_tokens(stream: bool) -> None:
    assert asyncio.run(_count(stream, requests=32, workers=16)) == 32 * TOKENS
