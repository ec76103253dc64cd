"""`vision` is checked like tools (docs/router.md, Capabilities): the model check sends a small PNG; the real
llama-server, started without a multimodal projector, refuses it and the check fails with what to change; the
sim answers it and the check passes. Through a real router, an image request then goes only where the check
passed, is refused with the check's words where every replica failed it, and is refused up front where the
repo says the model lacks vision; a plain chat is served everywhere."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from fixtures.llama import LlamaServer
from llmgw_router.app import serve
from llmgw_router.path.service import Router, RouterOptions

from llmgw.controller.loops.model_checks import probe_target
from llmgw.controller.wire.engine_http import EngineTarget
from llmgw.core.evals.model_checks import ProbeResult, probes_for, vision_request
from llmgw.core.snapshot import RouterSnapshot

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

ASK: Any = [{"role": "user", "content": "Say hi"}]
IMAGE: Any = vision_request("any")["messages"]


def test_the_vision_probe_is_due_for_a_model_declaring_it_and_sends_a_real_png() -> None:
    assert probes_for(["chat", "vision"]) == ["response_format", "stream_usage", "vision"]
    assert "vision" not in probes_for(["chat", "tools"])
    url = IMAGE[0]["content"][1]["image_url"]["url"]
    png = base64.b64decode(url.removeprefix("data:image/png;base64,"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png[16:24])
    (idat_len,) = struct.unpack(">I", png[33:37])
    assert png[37:41] == b"IDAT"
    rows = zlib.decompress(png[41 : 41 + idat_len])
    assert (width, height, len(rows)) == (32, 32, 32 * (1 + 3 * 32))


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    procs = {
        name: start_sim(name, f"engine-key-{name}", decode_ms=0.1, concurrency=2)
        for name in ("seeing", "text")
    }
    try:
        wait_healthy_sync(list(procs.values()))
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()


@pytest.fixture(scope="module")
def sim(sims: dict[str, SimProcess]) -> SimProcess:
    return sims["seeing"]


@pytest.fixture(scope="module")
def verdicts(llama_server: LlamaServer, sim: SimProcess) -> Iterator[dict[str, ProbeResult]]:
    import asyncio

    llama = EngineTarget("blind-1", "gemma", llama_server.base, llama_server.key, "llamacpp")
    seeing = EngineTarget("seeing-1", "seeing", sim.base_url, sim.key, "sim")

    async def both() -> dict[str, ProbeResult]:
        ((on_llama,), (on_sim,)) = [await probe_target(t, ["vision"]) for t in (llama, seeing)]
        return {"llamacpp": on_llama, "sim": on_sim}

    yield asyncio.run(both())


def test_the_check_fails_on_llama_server_without_a_projector_and_passes_on_the_sim(
    verdicts: dict[str, ProbeResult],
) -> None:
    failed = verdicts["llamacpp"]
    assert not failed.passed
    assert "blind-1 answered 500" in failed.detail and "image input is not supported" in failed.detail
    assert failed.detail.endswith(
        "llama-server reads images only with the model's multimodal projector (--mmproj FILE) loaded"
    )
    assert verdicts["sim"] == ProbeResult("vision", True, "ok: an image answered in words")


@pytest.fixture
async def gateway(
    llama_server: LlamaServer, sims: dict[str, SimProcess], verdicts: dict[str, ProbeResult]
) -> AsyncIterator[openai.AsyncOpenAI]:
    chat = {"context_length": 1024, "capabilities": ["chat", "completions", "vision"]}
    models = {
        "seeing": {**chat, "simulated": True},
        "gemma": chat,
        "text": {**chat, "capabilities": ["chat", "completions"], "without": ["vision"], "simulated": True},
    }
    failed = verdicts["llamacpp"]
    gemma = {
        "replica_id": "blind-1",
        "model": "gemma",
        "engine": "llamacpp",
        "base_url": llama_server.base,
        "api_key": llama_server.key,
        "slots": 1,
        "failed": ["vision"],
        "failed_details": {"vision": failed.detail},
    }
    endpoints = [
        endpoint(sims["seeing"], "seeing-1", verified=["vision"]),
        gemma,
        endpoint(sims["text"], "text-1"),
    ]
    router = Router(RouterOptions())
    router.apply_snapshot(
        RouterSnapshot.model_validate({"revision": "r1", "models": models, "endpoints": endpoints})
    )
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    url = f"http://127.0.0.1:{listeners.api_port}/v1"
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-any", max_retries=0, timeout=60) as c:
            yield c
    finally:
        await listeners.close()


@pytest.mark.llamacpp
async def test_an_image_goes_where_the_check_passed_and_is_refused_where_it_failed_or_is_lacked(
    gateway: openai.AsyncOpenAI, verdicts: dict[str, ProbeResult]
) -> None:
    seen = await gateway.chat.completions.create(model="seeing", messages=IMAGE, max_tokens=4)
    assert seen.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as failed:
        await gateway.chat.completions.create(model="gemma", messages=IMAGE, max_tokens=4)
    assert failed.value.code == "capability_check_failed" and failed.value.param == "messages"
    assert verdicts["llamacpp"].detail in failed.value.message
    assert "`llmgw model check gemma`" in failed.value.message
    with pytest.raises(openai.BadRequestError) as lacked:
        await gateway.chat.completions.create(model="text", messages=IMAGE, max_tokens=4)
    assert lacked.value.code == "unsupported_capability" and "lacks `vision`" in lacked.value.message
    for model in ("gemma", "text"):  # what they do serve, they serve
        plain = await gateway.chat.completions.create(model=model, messages=ASK, max_tokens=4)
        assert plain.choices[0].message.content is not None
