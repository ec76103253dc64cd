"""H5: a request reserves what it can really cost, and the engine is held to it.

A request without `max_tokens` reserves the rest of the context after its prompt (or the model's
`max_output_tokens`) and that cap is sent to the engine, so the reservation bounds the spend; `n` and
`best_of` multiply it. A Cluster-wide default concurrency applies to projects that declare none. Real sim
engines (which generate exactly `max_tokens` tokens, or 100 when none is sent) behind a router on loopback.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from llmgw_router.path.ratelimit import LimitGrant, memory_limiter
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync
from support import wait_for, write_bindings

from llmgw.core.config.secretrefs import SecretPolicy
from llmgw.core.errors import CatalogError
from llmgw.core.tenancy.limits import Tenant
from llmgw.core.tenancy.projects import TenantChain

from .request_path import KEY, catalog, model, published, start_router

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
SIM_DEFAULT_MAX_TOKENS = 100  # what the sim generates when it is sent no max_tokens


class Recording:
    """The router's real in-memory limiter, noting every reservation (tokens, cost) it is asked for."""

    def __init__(self) -> None:
        self.inner = memory_limiter(time.time)
        self.reserved: list[tuple[int, float]] = []

    async def acquire(self, chain: TenantChain, tokens: int, cost: float) -> LimitGrant:
        self.reserved.append((tokens, cost))
        return await self.inner.acquire(chain, tokens, cost)

    def end(self, lease: LimitGrant) -> None:
        self.inner.end(lease)

    def release(self, lease: LimitGrant, tokens_used: int, cost: float) -> None:
        self.inner.release(lease, tokens_used, cost)

    def budget_spent(self, tenant: Tenant) -> int | None:
        return self.inner.budget_spent(tenant)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim(
        "m", "engine-key-m", decode_ms=0.5, extra=["--max-tokens-default", str(SIM_DEFAULT_MAX_TOKENS)]
    )
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


def raw_chat(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}], **fields}).encode()


def prompt_estimate(raw: bytes) -> int:
    return int(len(raw) / 4 * 1.1)  # the router's estimate of a body's prompt tokens


async def post(url: str, raw: bytes) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", data=raw, headers=AUTH) as r,
    ):
        return r.status, await r.json()


async def serve_one(
    sim: SimProcess, raw: bytes, limits: dict[str, Any] | None = None, **spec: Any
) -> tuple[int, dict[str, Any], Recording]:
    limits = limits if limits is not None else {"tpm": 10**9}
    cat = catalog(model("m", **spec), project={"limits": limits})
    limiter = Recording()
    _, listeners, _, url = await start_router(published(cat, [endpoint(sim, "m-0")]), limiter=limiter)
    try:
        status, body = await post(url, raw)
    finally:
        await listeners.close()
    return status, body, limiter


async def test_h5_request_without_max_tokens_reserves_the_rest_of_the_context(sim: SimProcess) -> None:
    raw = raw_chat()
    status, body, limiter = await serve_one(sim, raw, context_length=300)
    assert status == 200, body
    # The prompt's estimate plus all the room it leaves: the whole context, which the engine (started with
    # `context_length` as its limit) cannot exceed, so nothing is sent for it to enforce.
    assert [tokens for tokens, _ in limiter.reserved] == [300]
    assert body["usage"]["completion_tokens"] == SIM_DEFAULT_MAX_TOKENS


async def test_h5_provider_without_max_tokens_is_sent_the_rest_of_the_context(
    sim: SimProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A provider's real context is not ours to know (it may be far larger than declared): it is sent the cap.
    monkeypatch.setenv("LLMGW_SECRET_SIM_KEY", sim.key)
    provider = {"url": sim.base_url + "/v1", "model": "m", "key": {"env": "LLMGW_SECRET_SIM_KEY"}}
    cat = catalog(model("ext", context_length=300, profiles=[], provider=provider))
    limiter = Recording()
    write_bindings(tmp_path, ["$LLMGW_SECRET_SIM_KEY: {purposes: [provider-key], hosts: [127.0.0.1]}"])
    secrets = SecretPolicy(tmp_path)
    _, listeners, _, url = await start_router(published(cat, []), limiter=limiter, secrets=secrets)
    # ignore_eos: the sim writes to the cap it is sent rather than ending by itself.
    message = {"model": "ext", "messages": [{"role": "user", "content": "hello"}], "ignore_eos": True}
    raw = json.dumps(message).encode()
    try:
        status, body = await post(url, raw)
    finally:
        await listeners.close()
    assert status == 200, body
    assert [tokens for tokens, _ in limiter.reserved] == [300]
    assert body["usage"]["completion_tokens"] == 300 - prompt_estimate(raw)


async def test_h5_model_max_output_tokens_caps_the_reservation_and_is_sent(sim: SimProcess) -> None:
    raw = raw_chat()
    status, body, limiter = await serve_one(sim, raw, context_length=8192, max_output_tokens=40)
    assert status == 200, body
    assert [tokens for tokens, _ in limiter.reserved] == [prompt_estimate(raw) + 40]
    assert body["usage"]["completion_tokens"] == 40


async def test_h5_legacy_completion_without_max_tokens_reserves_and_is_sent_that_api_default(
    sim: SimProcess,
) -> None:
    raw = json.dumps({"model": "m", "prompt": "hello"}).encode()
    cat = catalog(model("m", context_length=8192), project={"limits": {"tpm": 10**9}})
    limiter = Recording()
    _, listeners, _, url = await start_router(published(cat, [endpoint(sim, "m-0")]), limiter=limiter)
    try:
        async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", data=raw, headers=AUTH) as r:
            status, body = r.status, await r.json()
    finally:
        await listeners.close()
    assert status == 200, body
    assert [tokens for tokens, _ in limiter.reserved] == [prompt_estimate(raw) + 16]
    assert body["usage"]["completion_tokens"] == 16


async def test_h5_client_max_tokens_is_kept_and_reserved_as_asked(sim: SimProcess) -> None:
    raw = raw_chat(max_tokens=7)
    status, body, limiter = await serve_one(sim, raw, context_length=8192, max_output_tokens=40)
    assert status == 200, body
    assert [tokens for tokens, _ in limiter.reserved] == [prompt_estimate(raw) + 7]
    assert body["usage"]["completion_tokens"] == 7


@pytest.mark.parametrize(("fields", "sequences"), [({"n": 3}, 3), ({"n": 2, "best_of": 4}, 4)])
async def test_h5_n_and_best_of_multiply_the_reservation(
    sim: SimProcess, fields: dict[str, Any], sequences: int
) -> None:
    raw = raw_chat(max_tokens=10, **fields)
    status, body, limiter = await serve_one(sim, raw)
    assert status == 200, body
    assert [tokens for tokens, _ in limiter.reserved] == [prompt_estimate(raw) + 10 * sequences]


async def test_h5_a_request_no_engine_saw_gives_its_whole_reservation_back() -> None:
    # Reserving the whole context must not make refusals costly: a request answered 503 before any engine saw
    # it spends nothing, so a client retrying against a model with no replica is not locked out by tpm.
    cat = catalog(model("m", context_length=600), project={"limits": {"tpm": 1000}})
    _, listeners, _, url = await start_router(published(cat, []))
    try:
        answers = [await post(url, raw_chat()) for _ in range(3)]
    finally:
        await listeners.close()
    assert [(status, body["error"]["code"]) for status, body in answers] == [(503, "model_unavailable")] * 3


async def test_h5_budget_cannot_be_outrun_by_leaving_out_max_tokens(sim: SimProcess) -> None:
    # One unit of money per token; 100 units left. A short prompt with no max_tokens may generate about 2000
    # tokens, so it is refused up front rather than admitted on a 10-token estimate.
    prices = {"input_per_million": 1e6, "output_per_million": 1e6}
    budget = {"budget": {"amount": 100, "period": "30d"}}
    status, body, limiter = await serve_one(
        sim, raw_chat(), limits=budget, context_length=2048, prices=prices
    )
    assert (status, body["error"]["code"]) == (429, "rate_limit_exceeded"), body
    assert "budget" in body["error"]["message"]
    assert limiter.reserved == [(2048, 2048.0)]
    status, body, _ = await serve_one(
        sim, raw_chat(max_tokens=5), limits=budget, context_length=2048, prices=prices
    )
    assert status == 200, body


async def test_h5_max_tokens_above_the_model_cap_is_refused(sim: SimProcess) -> None:
    status, body, limiter = await serve_one(sim, raw_chat(max_tokens=41), max_output_tokens=40)
    assert (status, body["error"]["code"], body["error"]["param"]) == (
        400,
        "max_tokens_too_large",
        "max_tokens",
    )
    assert "at most 40" in body["error"]["message"]
    assert limiter.reserved == []


@pytest.mark.parametrize("field", ["n", "best_of"])
async def test_h5_n_that_is_not_a_whole_number_is_refused(sim: SimProcess, field: str) -> None:
    # An engine that coerced "8" to 8 would generate eight times what was reserved.
    status, body, limiter = await serve_one(sim, raw_chat(max_tokens=1, **{field: "8"}))
    assert (status, body["error"]["code"], body["error"]["param"]) == (400, "invalid_type", field)
    assert limiter.reserved == []


def test_h5_max_output_tokens_must_leave_room_for_a_prompt() -> None:
    with pytest.raises(CatalogError) as refused:
        catalog(model("m", context_length=2048, max_output_tokens=2048))
    (problem,) = refused.value.errors
    assert problem.path == ("spec", "max_output_tokens")
    assert "leaves no room for a prompt in context_length 2048" in problem.message


async def test_h5_cluster_default_project_concurrency_applies_when_a_project_sets_none(
    sim: SimProcess,
) -> None:
    cluster = {"tenancy": {"default_project_concurrency": 1}}
    cat = catalog(model("m"), cluster=cluster)
    snap = published(cat, [endpoint(sim, "m-0")])
    assert snap.tenants.projects["tenant"].limits.concurrency == 1
    own = catalog(model("m"), cluster=cluster, project={"limits": {"concurrency": 3}})
    assert published(own, []).tenants.projects["tenant"].limits.concurrency == 3  # its own value wins
    router, listeners, _, url = await start_router(snap)
    try:
        async with aiohttp.ClientSession() as s:
            first = asyncio.create_task(
                s.post(url + "/v1/chat/completions", data=raw_chat(max_tokens=2000), headers=AUTH)
            )
            await wait_for(
                lambda: router.table is not None and router.table.endpoints["m"][0].inflight == 1,
                30,
                "the first request in flight",
            )
            async with s.post(url + "/v1/chat/completions", data=raw_chat(max_tokens=1), headers=AUTH) as r:
                status, body = r.status, await r.json()
            (await first).release()
    finally:
        await listeners.close()
    assert (status, body["error"]["code"]) == (429, "rate_limit_exceeded"), body
    assert "its 1 concurrent requests" in body["error"]["message"]
