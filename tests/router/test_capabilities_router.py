"""The capability rule through a real router and a sim engine (docs/router.md, Capabilities), driven by the
official openai client: a tools request reaches an unchecked replica; a model that lacks tools or images
refuses them with `unsupported_capability`; every replica failing the check gives `capability_check_failed`;
a `verified_only` model refuses until a check passed; /v1/models shows the effective set."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from llmgw_router.app import serve
from llmgw_router.path.service import Router, RouterOptions

from llmgw.core.snapshot import RouterSnapshot

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

TOOLS: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
ASK: Any = [{"role": "user", "content": "find x"}]
IMAGE: Any = [
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
]
HINT = "the engine answers in text, not tool_calls — the sim was started with fail_probes: tools"


SERVED = ("open", "base", "broken", "strict")


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    procs = {name: start_sim(name, f"engine-key-{name}", decode_ms=0.1, concurrency=2) for name in SERVED}
    try:
        wait_healthy_sync(list(procs.values()))
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()


def snapshot(sims: dict[str, SimProcess]) -> dict[str, Any]:
    chat = {"context_length": 2048, "capabilities": ["chat", "completions", "tools"], "simulated": True}
    models = {
        "open": {**chat, "fallbacks": ["base"]},
        "base": {**chat, "capabilities": ["chat", "completions"], "without": ["tools", "vision"]},
        "broken": chat,
        "strict": {**chat, "verified_only": True},
        "embed": {"context_length": 512, "capabilities": ["embeddings"], "simulated": True},
    }
    failed = {"failed": ["tools"], "failed_details": {"tools": HINT}}
    endpoints = [endpoint(sims[name], f"{name}-1", **(failed if name == "broken" else {})) for name in SERVED]
    return {"revision": "r1", "models": models, "endpoints": endpoints}


@pytest.fixture
async def gateway(sims: dict[str, SimProcess]) -> AsyncIterator[tuple[Router, openai.AsyncOpenAI]]:
    router = Router(RouterOptions())
    router.apply_snapshot(RouterSnapshot.model_validate(snapshot(sims)))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    url = f"http://127.0.0.1:{listeners.api_port}/v1"
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-any", max_retries=0, timeout=60) as c:
            yield router, c
    finally:
        await listeners.close()


async def test_a_tools_request_reaches_an_unchecked_replica(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    _, c = gateway
    raw = await c.chat.completions.with_raw_response.create(model="open", messages=ASK, tools=TOOLS)
    assert raw.headers["x-llmgw-model"] == "open"
    answer = raw.parse()
    assert answer.choices[0].finish_reason == "tool_calls" and answer.choices[0].message.tool_calls


async def test_a_lacked_capability_is_refused_with_what_lifts_it(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    _, c = gateway
    with pytest.raises(openai.BadRequestError) as tools:
        await c.chat.completions.create(model="base", messages=ASK, tools=TOOLS)
    assert tools.value.code == "unsupported_capability" and tools.value.param == "tools"
    assert "remove `tools` from the model's `without`" in tools.value.message
    with pytest.raises(openai.BadRequestError) as image:
        await c.chat.completions.create(model="base", messages=IMAGE)
    assert image.value.code == "unsupported_capability" and "lacks `vision`" in image.value.message
    plain = await c.chat.completions.create(model="base", messages=ASK, max_tokens=2)
    assert plain.choices[0].message.content  # what it does serve, it serves
    with pytest.raises(openai.BadRequestError) as chat:
        await c.chat.completions.create(model="embed", messages=ASK)
    assert (
        chat.value.code == "unsupported_capability"
        and "add `chat` to the model's `capabilities`" in chat.value.message
    )


async def test_a_fallback_lacking_the_capability_is_not_tried(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    router, c = gateway
    table = router.table
    assert table is not None
    # open's only replica gone: an image request does not fall to `base`, which lacks vision; plain chat does.
    kept = [e.model_dump() for e in table.snapshot.endpoints if e.model != "open"]
    router.apply_snapshot(RouterSnapshot.model_validate({**table.snapshot.model_dump(), "endpoints": kept}))
    raw = await c.chat.completions.with_raw_response.create(model="open", messages=ASK, max_tokens=2)
    assert raw.headers["x-llmgw-model"] == "base"
    with pytest.raises(openai.APIStatusError) as image:
        await c.chat.completions.create(model="open", messages=IMAGE, max_tokens=2)
    assert image.value.status_code == 503 and getattr(image.value, "code", None) == "model_unavailable"


async def test_a_failed_check_refuses_with_the_checks_hint(
    gateway: tuple[Router, openai.AsyncOpenAI],
) -> None:
    _, c = gateway
    with pytest.raises(openai.BadRequestError) as refused:
        await c.chat.completions.create(model="broken", messages=ASK, tools=TOOLS)
    assert refused.value.code == "capability_check_failed"
    assert HINT in refused.value.message and "`llmgw model check broken`" in refused.value.message
    plain = await c.chat.completions.create(model="broken", messages=ASK, max_tokens=2)
    assert plain.choices[0].message.content


async def test_verified_only_refuses_until_a_check_passed(gateway: tuple[Router, openai.AsyncOpenAI]) -> None:
    router, c = gateway
    with pytest.raises(openai.BadRequestError) as refused:
        await c.chat.completions.create(model="strict", messages=ASK, tools=TOOLS)
    assert (
        refused.value.code == "capability_unverified"
        and "run `llmgw model check strict`" in refused.value.message.lower()
    )
    table = router.table
    assert table is not None
    snap = table.snapshot.model_dump()
    for e in snap["endpoints"]:
        if e["model"] == "strict":
            e["verified"] = ["tools"]
    router.apply_snapshot(RouterSnapshot.model_validate(snap))
    answer = await c.chat.completions.create(model="strict", messages=ASK, tools=TOOLS)
    assert answer.choices[0].message.tool_calls


async def test_v1_models_shows_the_effective_set(gateway: tuple[Router, openai.AsyncOpenAI]) -> None:
    _, c = gateway
    cards = {m.id: m.model_dump() for m in (await c.models.list()).data}
    assert cards["base"]["capabilities"] == ["chat", "completions"] and cards["base"]["without"] == [
        "tools",
        "vision",
    ]
    assert (
        cards["open"]["capabilities"] == ["chat", "completions", "tools"] and cards["open"]["without"] == []
    )
    assert (
        cards["broken"]["failed_capabilities"] == ["tools"] and cards["broken"]["verified_capabilities"] == []
    )
    assert cards["strict"]["verified_only"] is True and cards["open"]["verified_only"] is False
