"""H2: fallbacks are resolved once, by the catalog, and never lead a project past its model allowlist.

The controller publishes `Catalog.fallback_chain` (aliases resolved, followed transitively) and the catalog's
`on_demand`; the router follows that chain, skipping every model the requesting project may not use, and
never asks to load one. Real sim engines behind a router on loopback, driven over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync
from support import wait_for

from .request_path import KEY, catalog, model, published, start_router

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    procs = {name: start_sim(name, f"engine-key-{name}", decode_ms=20.0) for name in ("a", "b", "c")}
    try:
        wait_healthy_sync(list(procs.values()))
        yield procs
    finally:
        for p in procs.values():
            p.kill()


def chat(name: str, max_tokens: int = 1) -> dict[str, Any]:
    return {"model": name, "messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens}


async def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body, headers=AUTH) as r,
    ):
        return r.status, await r.json(), dict(r.headers)


async def test_h2_alias_used_as_fallback_is_followed(sims: dict[str, SimProcess]) -> None:
    # `a` has no replica ready; its fallback is written as b's alias.
    cat = catalog(model("a", fallbacks=["b-alias"]), model("b", aliases=["b-alias"]))
    _, listeners, _, url = await start_router(published(cat, [endpoint(sims["b"], "b-0")]))
    try:
        status, body, headers = await post(url, chat("a"))
    finally:
        await listeners.close()
    assert status == 200, body
    assert headers["x-llmgw-fallback"] == "b" and body["model"] == "b"


async def test_h2_fallback_of_a_fallback_is_followed(sims: dict[str, SimProcess]) -> None:
    # a -> b -> c: neither a nor b has a replica; c does.
    cat = catalog(model("a", fallbacks=["b"]), model("b", fallbacks=["c"]), model("c"))
    _, listeners, _, url = await start_router(published(cat, [endpoint(sims["c"], "c-0")]))
    try:
        status, body, headers = await post(url, chat("a"))
    finally:
        await listeners.close()
    assert status == 200, body
    assert headers["x-llmgw-fallback"] == "c" and body["model"] == "c"


async def test_h2_parked_model_min_0_max_0_answers_at_once_without_a_load(
    sims: dict[str, SimProcess],
) -> None:
    # Scaled to zero on purpose: there is nothing to wait for, so the answer is "unavailable" now, not a load
    # request and a wait (on_demand_wait is 30 s here: a wrong router would answer `model_loading` after it).
    cat = catalog(model("a", scaling={"min": 0, "max": 0}))
    snap = published(cat, [])
    assert not snap.models["a"].on_demand
    _, listeners, loads, url = await start_router(snap, on_demand_wait=30.0)
    try:
        status, body, _ = await post(url, chat("a"))
    finally:
        await listeners.close()
    assert (status, body["error"]["code"]) == (503, "model_unavailable"), body
    assert loads.asked == []


async def test_h2_disallowed_fallback_is_skipped_when_the_allowed_model_is_full(
    sims: dict[str, SimProcess],
) -> None:
    # The exploit: the project may use only `a`; `a` falls back to `b`, meant for others. Fill a's one slot
    # and ask again: the answer must be a refusal, never `b`.
    cat = catalog(model("a", fallbacks=["b"]), model("b"), project={"models": ["a"]})
    snap = published(
        cat,
        [endpoint(sims["a"], "a-0", slots=1), endpoint(sims["b"], "b-0")],
        admission={"queue_size": 0, "timeout": "30s"},
    )
    router, listeners, _, url = await start_router(snap)
    try:
        async with aiohttp.ClientSession() as s:
            first = asyncio.create_task(
                s.post(url + "/v1/chat/completions", json=chat("a", 200), headers=AUTH)
            )
            await wait_for(
                lambda: router.table is not None and router.table.endpoints["a"][0].inflight == 1,
                30,
                "a's only slot taken",
            )
            async with s.post(url + "/v1/chat/completions", json=chat("a"), headers=AUTH) as r:
                status, headers, answer = r.status, dict(r.headers), await r.json()
            assert router.table is not None and router.table.endpoints["b"][0].inflight == 0
            (await first).release()
    finally:
        await listeners.close()
    assert status in (429, 503), answer
    assert headers.get("x-llmgw-model") != "b" and "x-llmgw-fallback" not in headers


async def test_h2_on_demand_fallback_the_project_may_not_use_is_never_loaded(
    sims: dict[str, SimProcess],
) -> None:
    # `a` has no replica; its fallback `lazy` loads on demand, but the project may not use it: no load is
    # asked for on its behalf, and the answer comes at once.
    cat = catalog(
        model("a", fallbacks=["lazy"]),
        model("lazy", scaling={"min": 0, "max": 1, "idle_timeout": "10m"}),
        project={"models": ["a"]},
    )
    snap = published(cat, [])
    assert snap.models["lazy"].on_demand
    _, listeners, loads, url = await start_router(snap, on_demand_wait=30.0)
    try:
        status, body, _ = await post(url, chat("a"))
    finally:
        await listeners.close()
    assert (status, body["error"]["code"]) == (503, "model_unavailable"), body
    assert loads.asked == []


async def test_h2_allowed_fallback_is_still_served(sims: dict[str, SimProcess]) -> None:
    # The filter drops only what the project may not use: an allowed fallback keeps working.
    cat = catalog(model("a", fallbacks=["b"]), model("b"), project={"models": ["a", "b"]})
    _, listeners, _, url = await start_router(published(cat, [endpoint(sims["b"], "b-0")]))
    try:
        status, body, headers = await post(url, chat("a"))
    finally:
        await listeners.close()
    assert status == 200, body
    assert headers["x-llmgw-fallback"] == "b"
