"""A sim answer with no limit set ends by itself, so the Responses translation says `completed` (and streams
`response.completed`), as it would for a real model; the client's max_output_tokens still makes it
`incomplete`. Frameworks treat `incomplete` with no limit of theirs as an error (issue 37)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from llmgw_router.app import serve
from llmgw_router.path.service import Router, RouterOptions

from llmgw.core.snapshot import RouterSnapshot

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("sim-chat", "engine-key-f", decode_ms=0.1)
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def client(sim: SimProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    router = Router(RouterOptions())
    snapshot = {
        "revision": "r1",
        "models": {"sim-chat": {"context_length": 2048, "simulated": True}},
        "endpoints": [endpoint(sim, "rep-f")],
    }
    router.apply_snapshot(RouterSnapshot.model_validate(snapshot))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    url = f"http://127.0.0.1:{listeners.api_port}/v1"
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-any", max_retries=0, timeout=60) as c:
            yield c
    finally:
        await listeners.close()


async def test_no_limit_completes(client: openai.AsyncOpenAI) -> None:
    resp = await client.responses.create(model="sim-chat", input="hello there")
    assert resp.status == "completed" and resp.incomplete_details is None
    assert resp.output_text and resp.usage is not None and resp.usage.output_tokens == 16  # the sim's own end
    async with client.responses.stream(model="sim-chat", input="hello there") as stream:
        kinds = [event.type async for event in stream]
    assert kinds[-1] == "response.completed" and "response.incomplete" not in kinds


async def test_the_clients_limit_still_makes_it_incomplete(client: openai.AsyncOpenAI) -> None:
    resp = await client.responses.create(model="sim-chat", input="hello there", max_output_tokens=3)
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    chat = await client.chat.completions.create(
        model="sim-chat", messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.choices[0].finish_reason == "stop"
