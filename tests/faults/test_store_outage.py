"""The store (PostgreSQL) stopped for about ten seconds under a router that is taking traffic: every request
is still answered (keys from the router's cache), and every usage record reaches the store once it is back."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from llmgw_router.path.auth import Authenticator
from llmgw_router.server.errors import ApiError
from router.helpers import start_sim, wait_healthy_sync
from support import wait_for

from faults.procs import start_router_proc
from llmgw.adapters.keys import create_key, hash_key
from llmgw.store import KeyLookup, Store, StoreUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

OUTAGE_S = 10.0


def _pending(metrics_url: str) -> float | None:
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("llmgw_router_usage_pending "):
                return float(line.split()[1])
    return None


async def _usage_count(dsn: str) -> int:
    store = await Store.open(dsn)
    try:
        return (await store.row_counts())["usage"]
    finally:
        await store.close()


async def test_store_unreachable_for_ten_seconds_loses_no_usage_record(
    pg_server, pg_dsn: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    if not pg_server.controllable:
        pytest.skip("external PostgreSQL: cannot stop it")
    store = await Store.open(pg_dsn)
    try:
        key = (await create_key(store, "p1", time.time(), name="outage")).plaintext
    finally:
        await store.close()
    sim = start_sim("sim-chat", "engine-key")
    try:
        await asyncio.to_thread(wait_healthy_sync, [sim])
        snapshot = {
            "revision": "outage-1",
            "models": {"sim-chat": {"context_length": 4096}},
            "endpoints": [
                {
                    "replica_id": "s1",
                    "model": "sim-chat",
                    "engine": "sim",
                    "base_url": sim.base_url,
                    "api_key": sim.key,
                }
            ],
        }
        (tmp_path / "snapshot.json").write_text(json.dumps(snapshot))
        router = start_router_proc(
            tmp_path / "router.log", ["--snapshot", str(tmp_path / "snapshot.json"), "--store", pg_dsn]
        )
        made = 0
        try:
            async with openai.AsyncOpenAI(
                base_url=router.api + "/v1", api_key=key, max_retries=0, timeout=30
            ) as client:

                async def one(tag: str) -> None:
                    nonlocal made
                    r = await client.completions.create(model="sim-chat", prompt=tag, max_tokens=3)
                    made += 1
                    assert r.choices and r.choices[0].text

                for i in range(20):
                    await one(f"before {i}")
                await asyncio.to_thread(pg_server.stop)
                try:
                    stopped_at = time.monotonic()
                    during = 0
                    while time.monotonic() - stopped_at < OUTAGE_S:  # the outage lasts this long, under load
                        await one(f"during {during}")
                        during += 1
                    assert during > 10
                    backlog = await asyncio.to_thread(_pending, router.metrics)
                    assert backlog is not None and backlog > 0, "the backlog is visible on /metrics"
                finally:
                    await asyncio.to_thread(pg_server.start)
                for i in range(20):
                    await one(f"after {i}")

            async def all_written() -> int | None:
                count = await _usage_count(pg_dsn)
                return count if count >= made else None

            count = await wait_for(all_written, 60, f"{made} usage records written", interval=0.2)
            assert count == made, f"{made} requests answered, {count} usage records written"
            assert await asyncio.to_thread(_pending, router.metrics) == 0
        finally:
            router.stop()
        log = router.text()
        assert "dropped" not in log, log[-2000:]
        assert key not in log
    finally:
        sim.kill()


class FlakyKeys:
    """A key store that answers until `down` is set, then raises as an unreachable store does."""

    def __init__(self, known: dict[str, KeyLookup]) -> None:
        self.known, self.down = known, False

    async def lookup_key(self, key_hash: str) -> KeyLookup | None:
        if self.down:
            raise StoreUnavailable("PostgreSQL store: connection refused")
        return self.known.get(key_hash)


async def test_key_cache_outlives_an_outage_and_an_unseen_key_is_a_503() -> None:
    now = [1000.0]
    known, never_seen = (
        "sk-llmgw-" + "k" * 43,
        "sk-llmgw-" + "n" * 43,
    )  # key-shaped: others are never looked up
    keys = FlakyKeys({hash_key(known): KeyLookup("k1", "p1", "active", None)})
    auth = Authenticator(keys, clock=lambda: now[0], ttl=10.0)
    assert (await auth.authenticate(f"Bearer {known}")).project == "p1"
    keys.down = True
    now[0] += 60.0  # long past the cache's TTL
    assert (await auth.authenticate(f"Bearer {known}")).project == "p1"
    with pytest.raises(ApiError) as caught:
        await auth.authenticate(f"Bearer {never_seen}")
    assert caught.value.status == 503 and caught.value.code == "key_store_unavailable"
    assert caught.value.headers["Retry-After"]
    keys.down = False
    with pytest.raises(ApiError) as caught:
        await auth.authenticate(f"Bearer {never_seen}")
    assert caught.value.status == 401
