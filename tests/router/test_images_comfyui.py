"""`/v1/images/generations` through a ComfyUI model: the openai SDK's `images.generate` through a real router to
a stand-in ComfyUI speaking ComfyUI's HTTP and websocket API (comfyui_standin.py), the checks a chat gets
(key, allowlist, limits, the guardrails on the prompt, usage by picture) and a client that leaves taking its
workflow off the queue, or interrupting it once it runs."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.ratelimit import memory_limiter
from llmgw_router.path.service import Router, RouterOptions
from support import wait_for

from llmgw.adapters.keys import hash_key
from llmgw.core.snapshot import RouterSnapshot
from llmgw.store.records import UsageRecord

from .comfyui_standin import ComfyStandIn, png

pytestmark = pytest.mark.integration

KEYS = {"p1": "sk-llmgw-" + "e" * 43, "p2": "sk-llmgw-" + "f" * 43, "slow": "sk-llmgw-" + "g" * 43}


class Usage:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def record(self, rec: UsageRecord) -> None:
        self.records.append(rec)

    async def of(self, request_id: str) -> UsageRecord:
        found = await wait_for(
            lambda: next((r for r in self.records if r.request_id == request_id), None), 10, "the usage row"
        )
        assert isinstance(found, UsageRecord)
        return found


def snapshot(comfy_url: str, workflow: str | None = None) -> RouterSnapshot:
    provider: dict[str, Any] = {"url": comfy_url, "model": "flux-schnell", "api": "comfyui"}
    if workflow is not None:
        provider["workflow"] = workflow
    return RouterSnapshot.model_validate(
        {
            "revision": "images-1",
            "models": {
                "flux": {
                    "context_length": 512,
                    "capabilities": ["images"],
                    "prices": {"per_image": 0.04},
                    "provider": provider,
                },
            },
            "tenants": {
                "organizations": {"acme": {}},
                "projects": {
                    "p1": {"organization": "acme", "models": ["flux"]},
                    "p2": {"organization": "acme", "models": []},
                    "slow": {"organization": "acme", "models": ["flux"], "limits": {"rpm": 1}},
                },
            },
            "guard": {
                "guardrails": {"words": {"keywords": ["forbidden"]}},
                "projects": {"p1": ["words"], "slow": ["words"]},
            },
        }
    )


@pytest.fixture
async def comfy() -> AsyncIterator[ComfyStandIn]:
    standin = ComfyStandIn()
    await standin.start()
    try:
        yield standin
    finally:
        await standin.close()


async def start(snap: RouterSnapshot) -> tuple[Router, Listeners, Usage]:
    usage = Usage()
    keys = StaticKeys.from_file_lines([f"{hash_key(k)} {p} key-{p}" for p, k in KEYS.items()])
    router = Router(
        RouterOptions(router_id="r1"),
        Authenticator(keys),
        limiter=memory_limiter(lambda: __import__("time").time()),
        usage=usage,
    )
    router.apply_snapshot(snap)
    return router, await serve(router, "127.0.0.1:0", "127.0.0.1:0"), usage


@pytest.fixture
async def gateway(comfy: ComfyStandIn) -> AsyncIterator[tuple[str, Usage]]:
    _, listeners, usage = await start(snapshot(comfy.url))
    try:
        yield f"http://127.0.0.1:{listeners.api_port}", usage
    finally:
        await listeners.close()


def client(url: str, project: str = "p1") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[project], max_retries=0, timeout=30)


async def test_images_generate_with_the_openai_sdk_runs_the_builtin_flux_workflow(
    comfy: ComfyStandIn, gateway: tuple[str, Usage]
) -> None:
    url, usage = gateway
    async with client(url) as c:
        raw = await c.images.with_raw_response.generate(
            model="flux", prompt="a red fox in snow", size="512x768", n=2, extra_body={"seed": 7}
        )
    answer = raw.parse()
    assert answer.data is not None
    assert [base64.b64decode(d.b64_json or "") for d in answer.data] == [png(7), png(8)]
    (sent,) = comfy.received  # the built-in, its placeholders filled: numbers stay numbers
    assert sent["1"]["inputs"]["ckpt_name"] == "flux1-schnell-fp8.safetensors"
    assert sent["2"]["inputs"]["text"] == "a red fox in snow"
    assert sent["4"]["inputs"] == {"width": 512, "height": 768, "batch_size": 2}
    assert sent["5"]["inputs"]["seed"] == 7 and sent["5"]["inputs"]["steps"] == 4
    rec = await usage.of(raw.headers["x-request-id"])
    assert (rec.status, rec.model, rec.endpoint) == (200, "flux", "provider:flux")
    assert rec.decision is not None and rec.decision["images"] == 2
    assert rec.cost == pytest.approx(2 * 0.04)


async def test_a_picture_request_gets_the_checks_a_chat_gets(
    comfy: ComfyStandIn, gateway: tuple[str, Usage]
) -> None:
    url, _ = gateway
    async with client(url, "p2") as c:  # the allowlist
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await c.images.generate(model="flux", prompt="a boat")
    assert denied.value.code == "model_not_allowed"
    async with client(url) as c:  # the guardrail on the prompt: no workflow is queued for it
        with pytest.raises(openai.BadRequestError) as blocked:
            await c.images.generate(model="flux", prompt="the forbidden picture")
        assert blocked.value.code == "guardrail_blocked"
        with pytest.raises(openai.BadRequestError) as bad_size:  # a 400 naming the field, before the queue
            await c.images.generate(model="flux", prompt="a boat", size="1000x3")  # type: ignore[arg-type]
        assert bad_size.value.code == "invalid_size" and "multiple of 8" in str(bad_size.value)
        with pytest.raises(openai.BadRequestError) as url_format:
            await c.images.generate(model="flux", prompt="a boat", response_format="url")
        assert url_format.value.code == "unsupported_response_format"
    async with client(url, "slow") as c:  # the project's limits: rpm 1
        await c.images.generate(model="flux", prompt="a boat")
        with pytest.raises(openai.RateLimitError):
            await c.images.generate(model="flux", prompt="a second boat")
    assert [w["2"]["inputs"]["text"] for w in comfy.received] == ["a boat"]
    async with client(url, "slow") as c:  # an unknown key never reaches the model list
        c.api_key = "sk-llmgw-" + "z" * 43
        with pytest.raises(openai.AuthenticationError):
            await c.images.generate(model="flux", prompt="a boat")


async def test_a_workflow_file_in_api_format_has_its_placeholders_filled(
    comfy: ComfyStandIn, tmp_path: Path
) -> None:
    workflow = {
        "3": {"class_type": "KSampler", "inputs": {"seed": "{{seed}}", "steps": 1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "watercolour, {{prompt}}, {{width}}px"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": "{{width}}", "height": "{{height}}"}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "x"}},
    }
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(workflow))
    _, listeners, _ = await start(snapshot(comfy.url, str(path)))
    try:
        async with client(f"http://127.0.0.1:{listeners.api_port}") as c:
            answer = await c.images.generate(model="flux", prompt='a "quoted" cat', size="256x256")
        assert answer.data is not None and len(answer.data) == 1
        (sent,) = comfy.received
        assert sent["6"]["inputs"]["text"] == 'watercolour, a "quoted" cat, 256px'
        assert sent["5"]["inputs"] == {"width": 256, "height": 256}
        assert isinstance(sent["3"]["inputs"]["seed"], int)  # drawn by the router when the client names none
        path.write_text(json.dumps({"1": {"class_type": "SaveImage", "inputs": {}}}))  # no {{prompt}}
        async with client(f"http://127.0.0.1:{listeners.api_port}") as c:
            with pytest.raises(openai.APIStatusError) as broken:
                await c.images.generate(model="flux", prompt="a cat")
        assert broken.value.status_code == 502 and "{{prompt}}" in str(broken.value)
    finally:
        await listeners.close()


async def _post_image(url: str, prompt: str) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"model": "flux", "prompt": prompt}
        headers = {"Authorization": f"Bearer {KEYS['p1']}"}
        async with s.post(url + "/v1/images/generations", json=body, headers=headers) as r:
            await r.read()


async def test_a_client_that_leaves_takes_its_workflow_off_the_queue_or_interrupts_it(
    comfy: ComfyStandIn, gateway: tuple[str, Usage]
) -> None:
    url, _ = gateway
    comfy.hold()  # the first workflow runs until released; the second waits in the queue behind it
    first = asyncio.create_task(_post_image(url, "the first"))
    await wait_for(lambda: comfy.running is not None, 10, "the first workflow to run")
    second = asyncio.create_task(_post_image(url, "the second"))
    await wait_for(lambda: len(comfy.pending) == 1, 10, "the second workflow to be queued")
    queued_id = comfy.pending[0][1]
    second.cancel()  # its client goes away while its workflow waits
    await wait_for(lambda: comfy.deleted == [queued_id], 10, "the router to delete the queued workflow")
    assert comfy.pending == [] and comfy.interrupted == []
    running_id = comfy.running[1] if comfy.running is not None else None
    first.cancel()  # this one's workflow is running: interrupted, that prompt only
    await wait_for(
        lambda: comfy.interrupted == [running_id], 10, "the router to interrupt the running workflow"
    )
    await wait_for(lambda: comfy.running is None, 10, "the stand-in to stop the interrupted workflow")
    await asyncio.gather(first, second, return_exceptions=True)
