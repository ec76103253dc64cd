"""L12: the router's per-request rows (`GET /requests/{id}` on the metrics listener: project, key id, user
tag, guard verdicts) need the router's operator token, as the admin API's same rows need `admin`; `/ready`
tells an anonymous client only whether the router is ready, not its revision or its guardrails' setup.

A router in the test's loop (request_path.py); the row is made by an anonymous request with a request id the
client chose, the way an attacker who read it in a log would ask for it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator
from llmgw_router.path.ratelimit import memory_limiter
from llmgw_router.path.service import Router, RouterOptions

from .request_path import catalog, model, published, tenant_keys

pytestmark = pytest.mark.integration

OPERATOR = "operator-token-" + "o" * 32


async def router_with(token: str | None) -> tuple[Router, Listeners]:
    router = Router(
        RouterOptions(operator_token=token),
        auth=Authenticator(tenant_keys()),
        limiter=memory_limiter(time.time),
    )
    router.apply_snapshot(published(catalog(model("m")), []))
    return router, await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)


@pytest.fixture
async def listeners() -> AsyncIterator[Listeners]:
    _router, served = await router_with(OPERATOR)
    try:
        yield served
    finally:
        await served.close()


async def make_row(session: aiohttp.ClientSession, api: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    async with session.post(f"{api}/v1/chat/completions", json=body, headers={"x-request-id": "seen-1"}) as r:
        assert r.status == 401  # anonymous: refused, but its row is kept in the router's buffer


async def test_l12_request_rows_need_the_operator_token(listeners: Listeners) -> None:
    api, metrics = f"http://127.0.0.1:{listeners.api_port}", f"http://127.0.0.1:{listeners.metrics_port}"
    async with aiohttp.ClientSession() as s:
        await make_row(s, api)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": OPERATOR}):
            async with s.get(f"{metrics}/requests/seen-1", headers=headers) as r:
                assert r.status == 401, headers
                assert "seen-1" not in await r.text()
        operator = {"Authorization": f"Bearer {OPERATOR}"}
        async with s.get(f"{metrics}/requests/seen-1", headers=operator) as r:
            assert r.status == 200
            [row] = (await r.json())["requests"]
        assert (row["request_id"], row["status"]) == ("seen-1", 401)
        async with s.get(f"{metrics}/metrics") as r:
            assert r.status == 200, "Prometheus still scrapes /metrics with no token"


async def test_l12_without_an_operator_token_no_row_is_served() -> None:
    _router, served = await router_with(None)
    try:
        api, metrics = f"http://127.0.0.1:{served.api_port}", f"http://127.0.0.1:{served.metrics_port}"
        async with aiohttp.ClientSession() as s:
            await make_row(s, api)
            async with s.get(f"{metrics}/requests/seen-1", headers={"Authorization": "Bearer "}) as r:
                assert r.status == 403 and "--operator-token-file" in await r.text()
    finally:
        await served.close()


async def test_l12_ready_tells_an_anonymous_client_only_ready(listeners: Listeners) -> None:
    api = f"http://127.0.0.1:{listeners.api_port}"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{api}/ready") as r:
            assert r.status == 200 and await r.json() == {"status": "ready"}
        async with s.get(f"{api}/ready", headers={"Authorization": f"Bearer {OPERATOR}"}) as r:
            detail = await r.json()
        assert detail["revision"] == "sec-1" and "guard" in detail
