"""A project's concurrency is one pool for every router process: 2 routers of 2 workers each (real
`llmgw-router --workers 2` processes over one store, SQLite and PostgreSQL), a project with concurrency 16,
an upstream that holds every request until the test releases it, 44 clients at once. In flight at the
upstream reaches 16 and never exceeds it; the other 28 get what one router answers: 429, the limit named.
Released, the slots go back to the store, and a second wave again reaches exactly 16."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from faults.procs import FakeEngine, RouterProc, start_router_proc
from support import wait_until
from tenancy.helpers import create_key, error_of

from llmgw.store import Store

pytestmark = pytest.mark.integration

MODEL = "held"
LIMIT = 16
CLIENTS = 44
HOLD_KEY = "project:capped:concurrency"


class HeldUpstream:
    """Chat completions that wait for `release()`; counts what is in flight and the most ever at once."""

    def __init__(self) -> None:
        self.engine = FakeEngine()
        self.lock = threading.Lock()
        self.inflight = 0
        self.peak = 0
        self._release: asyncio.Event | None = None
        self.engine.behave["/v1/chat/completions"] = self._chat
        self.engine.behave["/metrics"] = self._metrics

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        if self._release is None:
            self._release = asyncio.Event()
        with self.lock:
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
        try:
            await self._release.wait()
        finally:
            with self.lock:
                self.inflight -= 1
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": MODEL,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        text = (
            f"vllm:num_requests_running {self.inflight}\nvllm:num_requests_waiting 0\n"
            "vllm:kv_cache_usage_perc 0.0\n"
        )
        return web.Response(text=text)

    def release(self) -> None:
        loop, event = self.engine._loop, self._release
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    def rearm(self) -> None:
        """Hold the next wave (a fresh event, made in the engine's loop)."""
        loop = self.engine._loop
        assert loop is not None
        done = threading.Event()

        def make() -> None:
            self._release = asyncio.Event()
            done.set()

        loop.call_soon_threadsafe(make)
        assert done.wait(5)


@pytest.fixture
def upstream() -> Iterator[HeldUpstream]:
    held = HeldUpstream()
    held.engine.start()
    held.rearm()
    yield held
    held.release()
    held.engine.stop()


def _routers(tmp: Path, upstream: HeldUpstream, store_dsn: str) -> list[RouterProc]:
    snap = {
        "revision": "pooled-1",
        "models": {MODEL: {"context_length": 4096}},
        "tenants": {
            "organizations": {"o": {}},
            "projects": {"capped": {"organization": "o", "limits": {"concurrency": LIMIT}}},
        },
        "endpoints": [
            {
                "replica_id": "held-0",
                "model": MODEL,
                "engine": "vllm",
                "slots": 4 * CLIENTS,
                "base_url": upstream.engine.base_url,
                "api_key": "engine-key",
            }
        ],
    }
    (tmp / "snap.json").write_text(json.dumps(snap))
    routers: list[RouterProc] = []
    try:
        for name in ("r1", "r2"):
            args = [
                "--snapshot",
                str(tmp / "snap.json"),
                "--store",
                store_dsn,
                "--workers",
                "2",
                "--router-id",
                name,
                "--state-dir",
                str(tmp / name),
            ]
            routers.append(start_router_proc(tmp / f"{name}.log", args))
    except BaseException:
        for r in routers:
            r.stop()
        raise
    return routers


def _ask(router: RouterProc, key: str) -> Any:
    with openai.OpenAI(base_url=router.base_url, api_key=key, max_retries=0, timeout=120) as client:
        try:
            return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        except openai.RateLimitError as exc:
            return exc


def _held_in_store(store_dsn: str) -> int:
    async def go() -> int:
        store = await Store.open(store_dsn)
        try:
            return await store.slots_held(HOLD_KEY, time.time())
        finally:
            await store.close()

    return asyncio.run(go())


def _wave(
    pool: ThreadPoolExecutor, routers: list[RouterProc], key: str, upstream: HeldUpstream, clients: int
) -> None:
    futures: list[Future[Any]] = [pool.submit(_ask, routers[i % 2], key) for i in range(clients)]
    refused = lambda: [f.result() for f in futures if f.done()]  # noqa: E731
    wait_until(
        lambda: upstream.inflight == LIMIT and len(refused()) == clients - LIMIT,
        60,
        f"{LIMIT} in flight upstream and {clients - LIMIT} refused",
    )
    assert upstream.peak == LIMIT, f"{upstream.peak} requests were in flight at once upstream"
    for exc in refused():
        assert isinstance(exc, openai.RateLimitError), exc
        err = error_of(exc)
        assert err["code"] == "rate_limit_exceeded"
        assert "project 'capped'" in err["message"] and f"{LIMIT} concurrent requests" in err["message"]
        assert exc.response.headers.get("retry-after") == "1"
    upstream.release()
    answers = [f.result(timeout=60) for f in futures if not isinstance(f.result(timeout=60), Exception)]
    assert len(answers) == LIMIT and all(a.choices[0].message.content == "ok" for a in answers)


def test_two_routers_of_two_workers_hold_concurrency_16_at_16(
    tmp_path: Path, upstream: HeldUpstream, store_dsn: str
) -> None:
    key = create_key(store_dsn, "capped")
    routers = _routers(tmp_path, upstream, store_dsn)
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            _wave(pool, routers, key, upstream, CLIENTS)
            # Every slot goes back to the store once its request ended (after the linger), so the pool is
            # whole again for whichever worker of whichever router gets the next requests.
            wait_until(lambda: _held_in_store(store_dsn) == 0, 30, "every slot given back to the store")
            upstream.rearm()
            upstream.peak = 0
            _wave(pool, routers, key, upstream, LIMIT + 4)
    finally:
        for r in routers:
            assert r.stop() == 0, r.text()[-3000:]
    for r in routers:
        assert "Traceback" not in r.text(), r.text()[-3000:]
