"""/v1/rerank and /v1/score through a real router and sim engines, with plain HTTP: the answers as vLLM and
llama.cpp give them, the tokens charged from the engine's usage, and a model that does not declare the
capability refused by the router (a 400 naming it, not the engine's 404)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from llmgw_router.app import serve
from llmgw_router.path.service import Router, RouterOptions
from support import wait_for

from llmgw.core.snapshot import RouterSnapshot

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

DOCS = ["the cat sat on the mat", "stock prices fell today", "a cat and a dog"]


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    procs = [start_sim("sim-rank", "k-rank"), start_sim("sim-chat", "k-chat")]
    try:
        wait_healthy_sync(procs)
        yield procs
    finally:
        for p in procs:
            p.kill()


@pytest.fixture
async def gateway(sims: list[SimProcess]) -> AsyncIterator[tuple[Router, str]]:
    models = {
        "sim-rank": {
            "context_length": 2048,
            "capabilities": ["rerank", "score", "embeddings"],
            "simulated": True,
        },
        "sim-chat": {"context_length": 2048, "capabilities": ["chat"], "simulated": True},
    }
    snap = {
        "revision": "r1",
        "models": models,
        "endpoints": [endpoint(sims[0], "rep-rank"), endpoint(sims[1], "rep-chat")],
    }
    router = Router(RouterOptions())
    router.apply_snapshot(RouterSnapshot.model_validate(snap))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    try:
        yield router, f"http://127.0.0.1:{listeners.api_port}/v1"
    finally:
        await listeners.close()


async def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.json()


def prompt_tokens(router: Router, model: str) -> float | None:
    return router.metrics.registry.get_sample_value(
        "llmgw_router_tokens_total", {"model": model, "direction": "prompt"}
    )


async def test_rerank_orders_documents_and_is_charged_the_engines_tokens(gateway: tuple[Router, str]) -> None:
    router, url = gateway
    status, body = await post(url + "/rerank", {"model": "sim-rank", "query": "cat", "documents": DOCS})
    assert status == 200, body
    results = body["results"]
    assert [r["index"] for r in results] == [2, 0, 1]  # word overlap with "cat"
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0 and scores[-1] == 0
    assert results[0]["document"] == {"text": DOCS[2]}
    # The sim counts the query once per document plus the documents: 3 + 6 + 4 + 5.
    assert body["usage"]["prompt_tokens"] == 18
    await wait_for(lambda: prompt_tokens(router, "sim-rank") == 18, 10, "rerank prompt tokens charged")
    status, top = await post(
        url + "/rerank",
        {"model": "sim-rank", "query": "cat", "documents": DOCS, "top_n": 1, "return_documents": False},
    )
    assert status == 200 and top["results"] == [
        {"index": 2, "relevance_score": results[0]["relevance_score"]}
    ]


async def test_score_pairs_text_1_with_each_text_2(gateway: tuple[Router, str]) -> None:
    _, url = gateway
    status, body = await post(url + "/score", {"model": "sim-rank", "text_1": "a cat", "text_2": DOCS})
    assert status == 200, body
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert body["data"][1]["score"] == 0 and body["data"][2]["score"] > body["data"][0]["score"] > 0
    assert body["usage"]["prompt_tokens"] > 0


async def test_a_model_without_the_capability_is_refused_by_the_router(gateway: tuple[Router, str]) -> None:
    _, url = gateway
    for path, body in (
        ("/rerank", {"model": "sim-chat", "query": "cat", "documents": DOCS}),
        ("/score", {"model": "sim-chat", "text_1": "a", "text_2": "b"}),
    ):
        status, answer = await post(url + path, body)
        capability = path[1:]
        assert status == 400, answer
        error = answer["error"]
        assert error["code"] == "unsupported_capability" and error["param"] == "model"
        assert f"`{capability}`" in error["message"]
    status, answer = await post(
        url + "/chat/completions", {"model": "sim-rank", "messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 400 and answer["error"]["code"] == "unsupported_capability"
