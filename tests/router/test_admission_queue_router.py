"""The one admission queue in a real router in front of real sim engines, driven over HTTP: two projects
flooding one model are served in proportion to their shares; a client that goes away leaves the queue at
once; a model whose replica is starting holds its requests until it is ready; a busy model answers 429
`queue_timeout` and a loading one 503 `model_loading` at their deadlines, each with Retry-After."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.service import Router, RouterOptions
from support import wait_for

from llmgw.adapters.keys import hash_key
from llmgw.core.snapshot import RouterSnapshot

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

KEY_SMALL = "sk-llmgw-" + "s" * 43
KEY_LARGE = "sk-llmgw-" + "l" * 43
KEY_VIP = "sk-llmgw-" + "v" * 43
SLOTS = 2  # the engine's and the endpoint's: few, so that both projects always have requests waiting
SHARES = {"small": 1.0, "large": 3.0}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    procs = {
        "fair": start_sim("sim-fair", "k-fair", decode_ms=10.0, concurrency=SLOTS),
        "slow": start_sim("sim-slow", "k-slow", decode_ms=20.0, concurrency=1),
        "grow": start_sim("sim-grow", "k-grow"),
    }
    try:
        wait_healthy_sync(list(procs.values()))
        yield procs
    finally:
        for p in procs.values():
            p.kill()


def snapshot(sims: dict[str, SimProcess], revision: str = "q-1", **router: Any) -> RouterSnapshot:
    return RouterSnapshot.model_validate(
        {
            "revision": revision,
            "router": {"max_body_bytes": 100_000, **router},
            "models": {
                "sim-fair": {"context_length": 4096},
                "sim-slow": {"context_length": 8192},
                "sim-grow": {"context_length": 4096},
                "lazy": {"context_length": 4096, "on_demand": True, "load_seconds": 30},
            },
            "tenants": {
                "organizations": {"acme": {}},
                "projects": {
                    **{
                        name: {"organization": "acme", "models": ["*"], "share": share}
                        for name, share in SHARES.items()
                    },
                    "vip": {"organization": "acme", "models": ["*"], "priority": 10},
                },
            },
            "endpoints": [
                endpoint(sims["fair"], "rep-fair", slots=SLOTS),
                endpoint(sims["slow"], "rep-slow", slots=1),
                endpoint(sims["grow"], "rep-grow", state="starting"),
            ],
        }
    )


class Controller:
    def __init__(self) -> None:
        self.loads: list[str] = []

    def request_load(self, model: str) -> None:
        self.loads.append(model)


@contextlib.asynccontextmanager
async def routed(snap: RouterSnapshot, **options: Any) -> AsyncIterator[tuple[Router, str]]:
    keys = StaticKeys.from_file_lines(
        [f"{hash_key(KEY_SMALL)} small", f"{hash_key(KEY_LARGE)} large", f"{hash_key(KEY_VIP)} vip"]
    )
    router = Router(RouterOptions(**options), auth=Authenticator(keys), controller=Controller())
    router.apply_snapshot(snap)
    listeners: Listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        yield router, f"http://127.0.0.1:{listeners.api_port}"
    finally:
        await listeners.close()


def chat(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


async def test_two_projects_flooding_one_model_are_served_in_proportion_to_their_shares(
    sims: dict[str, SimProcess],
) -> None:
    # Each project keeps 12 requests going against 2 slots of about 40 ms each: both always have requests
    # waiting, even while a client is slow to send its next one on a busy machine (the bound below holds
    # only while both wait).
    total, per_project = 96, 12
    answered = {name: 0 for name in SHARES}
    done = asyncio.Event()

    async with routed(snapshot(sims)) as (router, url):

        async def flood(name: str, c: openai.AsyncOpenAI) -> None:
            while not done.is_set():
                await c.chat.completions.create(
                    model="sim-fair", messages=[{"role": "user", "content": name}], max_tokens=4
                )
                if sum(answered.values()) < total:
                    answered[name] += 1
                if sum(answered.values()) >= total:
                    done.set()

        async with chat(url, KEY_SMALL) as small, chat(url, KEY_LARGE) as large:
            clients = {"small": small, "large": large}
            tasks = [asyncio.create_task(flood(n, clients[n])) for n in SHARES for _ in range(per_project)]
            try:
                await asyncio.wait_for(done.wait(), 120)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        await wait_for(lambda: router.admission.depth == 0, 10, "the queue empty after the flood")

    # Start-time fair queuing keeps two backlogged projects' admissions, each divided by its share, within
    # 1/share_s + 1/share_l of each other. With W_s + W_l = n that is |W_s - n*s/(s+l)| * (1/s + 1/l) <=
    # 1/s + 1/l: one request either way of the proportion, whatever the shares. Answers trail admissions by at
    # most the slots in flight, and the first SLOTS requests went straight in before any queue formed.
    s, ll = SHARES["small"], SHARES["large"]
    expected = total * s / (s + ll)
    tolerance = 1 + 2 * SLOTS
    assert abs(answered["small"] - expected) <= tolerance, (answered, expected, tolerance)
    assert sum(answered.values()) == total


async def test_a_higher_priority_project_goes_before_everything_queued_ahead_of_it(
    sims: dict[str, SimProcess],
) -> None:
    async with routed(snapshot(sims)) as (router, url):
        bulk_done: list[int] = []

        async def bulk(c: openai.AsyncOpenAI, i: int) -> None:
            await c.chat.completions.create(
                model="sim-slow", messages=[{"role": "user", "content": f"b{i}"}], max_tokens=5
            )
            bulk_done.append(i)

        async with chat(url, KEY_SMALL) as small, chat(url, KEY_VIP) as vip:
            tasks = [asyncio.create_task(bulk(small, i)) for i in range(6)]
            # One in flight on the only slot, five waiting: three priority-10 requests come after all of them
            # (three, so that fair shares alone, which would alternate the two projects, cannot pass this).
            await wait_for(lambda: router.admission.queued("sim-slow") == 5, 30, "five bulk requests queued")
            replies = await asyncio.gather(
                *(
                    vip.chat.completions.create(
                        model="sim-slow", messages=[{"role": "user", "content": f"v{i}"}], max_tokens=1
                    )
                    for i in range(3)
                )
            )
            assert all(r.choices[0].message.content for r in replies)
            # Served at the first freed slots: only the request already in flight finished before them.
            assert len(bulk_done) <= 1, bulk_done
            await asyncio.wait_for(asyncio.gather(*tasks), 60)


async def test_a_client_that_disconnects_while_queued_leaves_the_queue_at_once(
    sims: dict[str, SimProcess],
) -> None:
    async with routed(snapshot(sims)) as (router, url):
        table = router.table
        assert table is not None
        slow_ep = table.endpoints["sim-slow"][0]
        headers = {"Authorization": f"Bearer {KEY_SMALL}"}
        body = {"model": "sim-slow", "messages": [{"role": "user", "content": "x"}], "max_tokens": 500}
        async with aiohttp.ClientSession() as holder:
            busy = asyncio.create_task(holder.post(url + "/v1/chat/completions", json=body, headers=headers))
            await wait_for(lambda: slow_ep.inflight == 1, 30, "the slot held (about 10 s of decoding)")
            leaver = aiohttp.ClientSession()
            queued = asyncio.create_task(
                leaver.post(url + "/v1/chat/completions", json=dict(body, max_tokens=1), headers=headers)
            )
            await wait_for(lambda: router.admission.queued("sim-slow") == 1, 30, "the second request queued")
            queued.cancel()
            await asyncio.gather(queued, return_exceptions=True)
            await leaver.close()  # the client goes away: its socket closes
            await wait_for(
                lambda: router.admission.queued("sim-slow") == 0 and router.admission.depth == 0,
                5,
                "the queued request gone with its client",
            )
            assert slow_ep.inflight == 1 and not busy.done()  # left before any slot freed up
            busy.cancel()
            await asyncio.gather(busy, return_exceptions=True)
        await wait_for(lambda: slow_ep.inflight == 0, 30, "the busy request cancelled upstream")
        # Nothing leaked: the model serves the next request at once.
        async with chat(url, KEY_SMALL) as c:
            reply = await c.chat.completions.create(
                model="sim-slow", messages=[{"role": "user", "content": "y"}], max_tokens=1
            )
        assert reply.choices[0].message.content


@pytest.mark.parametrize("published_as", ["endpoint starting", "model starting count"])
async def test_a_model_with_a_starting_replica_holds_requests_until_it_is_ready(
    sims: dict[str, SimProcess], published_as: str
) -> None:
    # A replica on its way (here the only one) is published either as an endpoint in state `starting` or as
    # the model's `starting` count (what the controller publishes): without the hold this is 503 at once.
    raw = snapshot(sims).model_dump(mode="json")
    grow = next(ep for ep in raw["endpoints"] if ep["model"] == "sim-grow")
    if published_as == "model starting count":
        raw["endpoints"].remove(grow)
        raw["models"]["sim-grow"]["starting"] = 1
    async with routed(RouterSnapshot.model_validate(raw)) as (router, url), chat(url, KEY_LARGE) as c:
        held = asyncio.create_task(
            c.chat.completions.create(
                model="sim-grow", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        )
        await wait_for(lambda: router.admission.queued("sim-grow") == 1, 30, "the request held")
        raw["models"]["sim-grow"]["starting"] = 0
        raw["endpoints"] = [ep for ep in raw["endpoints"] if ep["model"] != "sim-grow"]
        raw["endpoints"].append(dict(grow, state="ready"))
        router.apply_snapshot(RouterSnapshot.model_validate(dict(raw, revision="q-2")))
        reply = await asyncio.wait_for(held, 30)
        assert reply.usage is not None and reply.usage.completion_tokens == 2


async def test_a_busy_model_answers_queue_timeout_at_the_queue_deadline(sims: dict[str, SimProcess]) -> None:
    snap = snapshot(sims, admission={"timeout": "1s"})
    async with routed(snap) as (router, url), aiohttp.ClientSession() as s:
        table = router.table
        assert table is not None
        headers = {"Authorization": f"Bearer {KEY_SMALL}"}
        # ignore_eos: the sim writes all 500 words, so the slot stays held past the queue's deadline.
        body = {
            "model": "sim-slow",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 500,
            "ignore_eos": True,
        }
        busy = asyncio.create_task(s.post(url + "/v1/chat/completions", json=body, headers=headers))
        await wait_for(lambda: table.endpoints["sim-slow"][0].inflight == 1, 30, "the slot held")
        async with s.post(url + "/v1/chat/completions", json=dict(body, max_tokens=1), headers=headers) as r:
            assert r.status == 429
            assert (await r.json())["error"]["code"] == "queue_timeout"
            assert int(r.headers["Retry-After"]) >= 1
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)
        assert router.metrics.registry.get_sample_value(
            "llmgw_router_admission_rejections_total", {"reason": "timeout"}
        )


async def test_a_loading_model_answers_model_loading_with_what_is_left_of_its_load_time(
    sims: dict[str, SimProcess],
) -> None:
    # lazy's load is measured at 30 s: the 503 tells the client to come back when it should be ready.
    async with routed(snapshot(sims), on_demand_wait=0.3) as (router, url), chat(url, KEY_SMALL) as c:
        asked = time.time()
        with pytest.raises(openai.InternalServerError) as loading:
            await c.chat.completions.create(
                model="lazy", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
        assert loading.value.status_code == 503 and loading.value.code == "model_loading"
        retry = int(loading.value.response.headers["Retry-After"])
        assert 1 <= retry <= 30 and retry >= 30 - (time.time() - asked) - 1
        assert router.metrics.registry.get_sample_value(
            "llmgw_router_admission_rejections_total", {"reason": "loading"}
        )


async def test_a_loading_model_without_a_measured_load_time_holds_for_the_load_timeout(
    sims: dict[str, SimProcess],
) -> None:
    raw = snapshot(sims, admission={"load_timeout": "1s"}).model_dump(mode="json")
    raw["models"]["lazy"]["load_seconds"] = None
    snap = RouterSnapshot.model_validate(raw)
    async with routed(snap) as (router, url), chat(url, KEY_SMALL) as c:
        table = router.table
        assert table is not None
        assert router.forwarding.load_hold(table, "lazy") == 1.0
        with pytest.raises(openai.InternalServerError) as loading:
            await c.chat.completions.create(
                model="lazy", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
        assert loading.value.code == "model_loading"
        assert loading.value.response.headers["Retry-After"] == "10"  # nothing measured: the default


def test_the_load_hold_follows_the_measured_load_time() -> None:
    raw = {"revision": "r", "models": {"m": {"context_length": 10, "on_demand": True, "load_seconds": 40}}}
    router = Router(RouterOptions())
    router.apply_snapshot(RouterSnapshot.model_validate(raw))
    assert router.table is not None
    assert router.forwarding.load_hold(router.table, "m") == 1.5 * 40 + 5
    raw["models"]["m"]["load_seconds"] = None  # type: ignore[index]
    router.apply_snapshot(RouterSnapshot.model_validate(raw))
    assert router.forwarding.load_hold(router.table, "m") == 120.0  # router.admission.load_timeout's default
