"""The response cache through a real router in front of a real sim engine, driven by the official openai
client: hit, miss, TTL expiry (the cache's clock injected), no-cache and no-store, streams replayed from the
cache, no hit across projects, a hit's charge in its usage row, and memory bounded under many requests.

Whether the engine was reached is read from the engine itself (its finished-request counter), not from the
router's word for it."""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.service import Router, RouterOptions
from support import wait_for

from llmgw.adapters.keys import hash_key
from llmgw.core.snapshot import RouterSnapshot
from llmgw.store.records import UsageRecord

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

KEYS = {
    p: "sk-llmgw-" + c * 43 for p, c in (("p1", "a"), ("p2", "b"), ("half", "c"), ("tiny", "d"), ("off", "e"))
}
PRICE = 1_000_000.0  # a unit of money per token: costs are token counts
MESSAGES: list[Any] = [{"role": "user", "content": "hello there"}]


class Usage:
    def __init__(self) -> None:
        self.rows: list[UsageRecord] = []

    def record(self, rec: UsageRecord) -> None:
        self.rows.append(rec)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("sim-chat", "engine-key")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


def snapshot(sim: SimProcess) -> RouterSnapshot:
    cache = {"ttl": "60s"}
    return RouterSnapshot.model_validate(
        {
            "revision": "cache-1",
            "models": {
                "sim-chat": {
                    "aliases": ["chat"],
                    "context_length": 2048,
                    "capabilities": ["chat", "completions", "embeddings"],
                    "prices": {"input_per_million": PRICE, "output_per_million": PRICE},
                    "simulated": True,
                }
            },
            "tenants": {
                "organizations": {"acme": {}},
                "projects": {
                    "p1": {"organization": "acme", "response_cache": cache},
                    "p2": {"organization": "acme", "response_cache": cache},
                    "half": {"organization": "acme", "response_cache": {**cache, "hit_charge": 0.5}},
                    "tiny": {
                        "organization": "acme",
                        "response_cache": {**cache, "max_bytes": 65536, "max_entry_bytes": 4096},
                    },
                    "off": {"organization": "acme"},
                },
            },
            "endpoints": [endpoint(sim, "rep-a")],
        }
    )


@pytest.fixture
async def gateway(sim: SimProcess) -> AsyncIterator[tuple[Router, str, Usage, Clock]]:
    usage, clock = Usage(), Clock()
    keys = StaticKeys.from_file_lines([f"{hash_key(k)} {p} key-{p}" for p, k in KEYS.items()])
    router = Router(RouterOptions(), auth=Authenticator(keys), usage=usage)
    router.cache.store.clock = clock
    router.apply_snapshot(snapshot(sim))
    listeners: Listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        yield router, f"http://127.0.0.1:{listeners.api_port}", usage, clock
    finally:
        await listeners.close()


def client(url: str, project: str = "p1") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[project], max_retries=0, timeout=60)


def engine_requests(sim: SimProcess) -> float:
    """Requests the engine itself finished (its own counter)."""
    with urllib.request.urlopen(sim.base_url + "/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith("vllm:request_success_total"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the sim engine reports no request_success_total")


async def chat(c: openai.AsyncOpenAI, headers: dict[str, str] | None = None, **kw: Any) -> tuple[str, Any]:
    """(x-llmgw-cache, the completion) of one chat request."""
    raw = await c.chat.completions.with_raw_response.create(
        model=kw.pop("model", "sim-chat"),
        messages=kw.pop("messages", MESSAGES),
        max_tokens=kw.pop("max_tokens", 5),
        extra_headers=headers,
        **kw,
    )
    return raw.headers.get("x-llmgw-cache", ""), raw.parse()


async def rows(usage: Usage, n: int) -> list[UsageRecord]:
    return list(await wait_for(lambda: usage.rows if len(usage.rows) >= n else None, 10, f"{n} usage rows"))


async def test_a_repeat_is_a_hit_that_reaches_no_engine_and_is_free(
    gateway: tuple[Router, str, Usage, Clock], sim: SimProcess
) -> None:
    _, url, usage, _ = gateway
    before = engine_requests(sim)
    async with client(url) as c:
        first_mark, first = await chat(c)
        second_mark, second = await chat(c, model="chat", user="someone-else")  # alias, and `user` ignored
        other_mark, _ = await chat(c, temperature=0.3)  # a sampling parameter is in the key
    assert (first_mark, second_mark, other_mark) == ("miss", "hit", "miss")
    assert engine_requests(sim) == before + 2, "the hit must not reach the engine"
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.id != first.id and second.id.startswith("chatcmpl-"), (first.id, second.id)
    assert second.usage is not None and second.usage.completion_tokens == 5  # the answer as it was stored
    miss, hit, _ = await rows(usage, 3)
    assert (miss.tokens_out, miss.cost) == (5, miss.tokens_in + 5.0)
    assert (hit.status, hit.tokens_in, hit.tokens_out, hit.cost, hit.endpoint) == (200, 0, 0, 0.0, "")
    assert hit.decision is not None and hit.decision["cache"] == "hit", hit.decision
    assert miss.decision is not None and "cache" not in miss.decision


async def test_a_hit_is_charged_the_fraction_the_project_says(
    gateway: tuple[Router, str, Usage, Clock],
) -> None:
    _, url, usage, _ = gateway
    async with client(url, "half") as c:
        await chat(c, max_tokens=8)
        mark, _ = await chat(c, max_tokens=8)
    assert mark == "hit"
    miss, hit = await rows(usage, 2)
    assert hit.tokens_out == 4 and hit.tokens_in == round(miss.tokens_in * 0.5)
    assert hit.cost == pytest.approx(hit.tokens_in + hit.tokens_out)


async def test_an_answer_older_than_the_ttl_is_not_served(
    gateway: tuple[Router, str, Usage, Clock], sim: SimProcess
) -> None:
    _, url, _, clock = gateway
    async with client(url) as c:
        assert (await chat(c))[0] == "miss"
        clock.now += 59.0
        assert (await chat(c))[0] == "hit"
        before = engine_requests(sim)
        clock.now += 1.0  # 60s after it was stored: the TTL is over
        assert (await chat(c))[0] == "miss"
        assert engine_requests(sim) == before + 1
        assert (await chat(c))[0] == "hit"  # the fresh answer is kept again


async def test_no_cache_asks_the_engine_and_stores_no_store_does_neither(
    gateway: tuple[Router, str, Usage, Clock], sim: SimProcess
) -> None:
    _, url, _, _ = gateway
    async with client(url) as c:
        _, first = await chat(c)
        mark, refreshed = await chat(c, {"Cache-Control": "no-cache"})
        assert mark == "refresh" and refreshed.id != first.id
        mark, after = await chat(c)
        assert mark == "hit" and after.choices[0].message.content == refreshed.choices[0].message.content
        before = engine_requests(sim)
        assert (await chat(c, {"cache-control": "no-store"}, max_tokens=3))[0] == "bypass"
        assert (await chat(c, max_tokens=3))[0] == "miss", "a no-store answer must not have been kept"
        assert engine_requests(sim) == before + 2


async def test_a_stream_is_replayed_from_the_cache_as_a_stream(
    gateway: tuple[Router, str, Usage, Clock], sim: SimProcess
) -> None:
    _, url, usage, _ = gateway

    async def stream(c: openai.AsyncOpenAI) -> tuple[str, list[Any]]:
        raw = await c.chat.completions.with_raw_response.create(
            model="sim-chat",
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        return raw.headers.get("x-llmgw-cache", ""), [chunk async for chunk in raw.parse()]

    async with client(url) as c:
        first_mark, first = await stream(c)
        before = engine_requests(sim)
        second_mark, second = await stream(c)
        assert engine_requests(sim) == before
        whole_mark, _ = await chat(c, max_tokens=6)  # not a stream: not answered by the stream's entry
    assert (first_mark, second_mark, whole_mark) == ("miss", "hit", "miss")

    def text(chunks: list[Any]) -> str:
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

    assert text(second) == text(first) and text(first)
    assert len(second) == len(first)
    assert {ch.id for ch in second} != {ch.id for ch in first} and len({ch.id for ch in second}) == 1
    assert second[-1].usage is not None and second[-1].usage.completion_tokens == 6  # the usage chunk kept
    hit = (await rows(usage, 3))[1]
    assert hit.decision is not None and hit.decision["cache"] == "hit" and hit.status == 200


async def test_one_projects_answer_is_never_another_projects_hit(
    gateway: tuple[Router, str, Usage, Clock], sim: SimProcess
) -> None:
    _, url, _, _ = gateway
    async with client(url, "p1") as p1, client(url, "p2") as p2, client(url, "off") as off:
        assert (await chat(p1))[0] == "miss"
        assert (await chat(p1))[0] == "hit"
        before = engine_requests(sim)
        assert (await chat(p2))[0] == "miss"
        assert (await chat(off))[0] == "", "a project without a cache is not marked"
        assert (await chat(off))[0] == ""
        assert engine_requests(sim) == before + 3


async def test_memory_stays_under_the_bound_with_many_distinct_requests(
    gateway: tuple[Router, str, Usage, Clock],
) -> None:
    router, url, _, _ = gateway
    bound = 65536
    async with client(url, "tiny") as c:
        for i in range(300):
            await chat(c, messages=[{"role": "user", "content": f"question number {i}"}], max_tokens=2)
            assert router.cache.store.projects["tiny"].bytes <= bound
        assert (await chat(c, messages=[{"role": "user", "content": "question number 299"}], max_tokens=2))[
            0
        ] == "hit"
        assert (await chat(c, messages=[{"role": "user", "content": "question number 0"}], max_tokens=2))[
            0
        ] == "miss", "the least recently used answer goes first"
        # An answer above max_entry_bytes is not kept at all.
        long = {"max_tokens": 2000, "extra_body": {"ignore_eos": True}}  # the sim writes all 2,000 words
        big = await chat(c, **long)
        assert len(big[1].choices[0].message.content) > 4096
        assert big[0] == "miss" and (await chat(c, **long))[0] == "miss"
    tiny = router.cache.store.projects["tiny"]
    assert 0 < len(tiny.entries) < 300 and router.cache.store.evictions > 0
    evictions = router.metrics.registry.get_sample_value("llmgw_router_cache_evictions_total")
    assert evictions == router.cache.store.evictions
    hits = router.metrics.registry.get_sample_value(
        "llmgw_router_cache_requests_total", {"model": "sim-chat", "result": "hit"}
    )
    assert hits == 1.0


async def test_a_canary_answer_is_never_kept_so_a_rolled_back_canary_leaves_nothing(
    gateway: tuple[Router, str, Usage, Clock], sim: SimProcess
) -> None:
    router, url, _, _ = gateway
    on_trial = snapshot(sim).model_dump(mode="json", by_alias=True)
    on_trial["models"]["sim-chat"]["canary"] = {"weight": 100}
    on_trial["endpoints"] = [endpoint(sim, "rep-canary", canary=True)]
    router.apply_snapshot(RouterSnapshot.model_validate(on_trial))
    async with client(url) as c:
        before = engine_requests(sim)
        marks = [(await chat(c, max_tokens=4))[0] for _ in range(2)]
        assert marks == ["miss", "miss"], "a canary's answer was kept"
        assert engine_requests(sim) == before + 2
        router.apply_snapshot(snapshot(sim))  # the canary rolled back: the stable replica serves
        assert [(await chat(c, max_tokens=4))[0] for _ in range(2)] == ["miss", "hit"]
