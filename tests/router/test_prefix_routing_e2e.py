"""Prefix routing end to end: a real router reading the KV events of sim engines, each publishing over ZMQ on
127.0.0.1 behind the agent's pass-through, which relays them to key holders (docs/security.md, H8)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from llmgw_agent.kv_relay import RELAY_PATH
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.service import Router, RouterOptions
from support import free_port, wait_for

from llmgw.adapters.keys import hash_key
from llmgw.core.snapshot import RouterSnapshot

from .helpers import SimProcess, endpoint, start_relaying_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

KEY_P1 = "sk-llmgw-" + "e" * 43
KEY_P2 = "sk-llmgw-" + "f" * 43
SYSTEM = " ".join(f"rule{i}" for i in range(160))  # 10 blocks of 16 words


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    out = [start_relaying_sim("sim-chat", f"engine-key-{i}") for i in range(3)]
    try:
        wait_healthy_sync(out)
        yield out
    finally:
        for s in out:
            s.kill()


def relays(sims: list[SimProcess]) -> dict[str, str]:
    return {f"rep-{i}": s.base_url + RELAY_PATH for i, s in enumerate(sims)}


def snapshot(sims: list[SimProcess], events: dict[str, str] | None = None) -> RouterSnapshot:
    urls = events or relays(sims)
    policy = {
        "picker": "max_score",
        "weights": {"prefix": 4, "inflight": 1},
        "prefix": {"events_stale_after": "1s"},
    }
    raw: dict[str, Any] = {
        "revision": "prefix-1",
        "router": {"default_policy": "prefix"},
        "policies": {"prefix": policy},
        "models": {"sim-chat": {"context_length": 8192, "simulated": True}},
        "tenants": {
            "organizations": {"acme": {}},
            "projects": {"p1": {"organization": "acme"}, "p2": {"organization": "acme"}},
        },
        "endpoints": [endpoint(s, f"rep-{i}", kv_events=urls[f"rep-{i}"]) for i, s in enumerate(sims)],
    }
    return RouterSnapshot.model_validate(raw)


async def ask(http: aiohttp.ClientSession, url: str, key: str, question: str) -> tuple[str, str, int]:
    body = {
        "model": "sim-chat",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 2,
    }
    headers = {"Authorization": f"Bearer {key}", "x-llmgw-debug": "dbg"}
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        data = await r.json()
        decision = r.headers["x-llmgw-decision"]
    chosen = decision.split(";")[0].removeprefix("endpoint=")
    return chosen, decision, data["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_requests_follow_the_engine_that_holds_their_prefix_then_fall_back_when_events_stop(
    sims: list[SimProcess],
) -> None:
    keys = StaticKeys.from_file_lines([f"{hash_key(KEY_P1)} p1 k1", f"{hash_key(KEY_P2)} p2 k2"])
    router = Router(RouterOptions(debug_token="dbg"), auth=Authenticator(keys))
    router.apply_snapshot(snapshot(sims))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    url = f"http://127.0.0.1:{listeners.api_port}"
    events = router.forwarding.prefix.events
    try:
        async with aiohttp.ClientSession() as http:
            # every subscription is up once an event from each engine has arrived
            await wait_for(
                lambda: all(events.fresh(f"rep-{i}", 1e18) for i in range(3)) or _poke(http, sims),
                30,
                "a KV event from every engine",
            )
            first, _, _ = await ask(http, url, KEY_P1, "first question")
            await wait_for(lambda: events.size(first) >= 10, 10, f"{first}'s stored blocks in the router")
            for n in range(4):
                chosen, decision, cached = await ask(http, url, KEY_P1, f"follow-up {n}")
                assert chosen == first, decision
                assert f"{first}:precise" in decision and "by=prefix" in decision, decision
                # the last of the prompt's blocks it holds, by the hash its engine published
                held = dict(p.split(":") for p in decision.split("prefix_held=")[1].split(";")[0].split(","))
                assert events.match(first, (int(held[first]),)) == 1, decision
                assert cached >= 160, decision  # the system prompt's blocks were served from the cache
            # another project's identical prompt is salted apart: it is not drawn to the same engine
            _, decision, cached = await ask(http, url, KEY_P2, "first question")
            assert cached == 0 and "by=prefix" not in decision, decision

            # the stream goes silent (the router now reads where nothing relays): once a request that
            # should have stored blocks goes unanswered for events_stale_after, the approximate index
            # answers, and still knows where the prefix went
            moved = f"http://127.0.0.1:{free_port()}{RELAY_PATH}"
            router.apply_snapshot(snapshot(sims, relays(sims) | {first: moved}))
            await wait_for(
                lambda: router.forwarding.prefix.subscribed.get(first) == moved, 10, "resubscribed"
            )
            long_question = " ".join(f"new{i}" for i in range(40))  # full blocks the engine lacks
            chosen, decision, _ = await ask(http, url, KEY_P1, long_question)
            assert chosen == first and f"{first}:precise" in decision, decision
            await wait_for(lambda: not events.fresh(first, router.clock()), 10, f"{first}'s stream stale")
            chosen, decision, cached = await ask(http, url, KEY_P1, "after the silence")
            assert chosen == first and f"{first}:approx" in decision and "by=prefix" in decision, decision
            assert cached >= 160

            # an engine clears its cache: AllBlocksCleared empties the router's view of it (another engine,
            # sent a prompt directly, whose stream is still subscribed)
            i = next(n for n in range(3) if f"rep-{n}" != first)
            engine, auth = sims[i].base_url, {"Authorization": f"Bearer engine-key-{i}"}
            direct = {
                "model": "sim-chat",
                "messages": [{"role": "system", "content": SYSTEM}],
                "max_tokens": 1,
            }
            async with http.post(engine + "/v1/chat/completions", json=direct, headers=auth) as r:
                assert r.status == 200
            await wait_for(
                lambda: events.size(f"rep-{i}") >= 10, 10, f"rep-{i}'s stored blocks in the router"
            )
            async with http.post(engine + "/reset_prefix_cache", headers=auth) as r:
                assert r.status == 200
            await wait_for(
                lambda: events.size(f"rep-{i}") == 0, 10, f"rep-{i}'s blocks cleared in the router"
            )
    finally:
        await listeners.close()


async def _poke(http: aiohttp.ClientSession, sims: list[SimProcess]) -> bool:
    """Make every engine publish something (a cache reset), for the subscriptions to see a first batch."""
    for i, s in enumerate(sims):
        async with http.post(
            s.base_url + "/reset_prefix_cache", headers={"Authorization": f"Bearer engine-key-{i}"}
        ):
            pass
    return False
