"""M13 (issue 35): a tenant's media URL never reaches an engine unchecked.

The exploit as the review sketches it: a chat whose `image_url` names the metadata service or a node-network
address, so the GPU node fetches it. Now every media part (chat `image_url`/`video_url`/`audio_url`, Responses
`input_image`, Anthropic `source: {type: url}`) must be inline (`data:`) or name a host in the Cluster's
`spec.router.media_hosts` that resolves to public addresses only; anything else is a 400 naming the part.
Through a real router in front of a real sim engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from llmgw_router.path.media import host_allowed
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

from .request_path import KEY, catalog, model, published, start_router

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"}
PNG = "data:image/png;base64,iVBORw0KGgo="
PUBLIC = "93.184.215.14"  # a literal public address: allowed below without a DNS lookup


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("m", "engine-key-m13")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def url(sim: SimProcess) -> AsyncIterator[str]:
    cat = catalog(model("m", capabilities=["chat", "vision"]))
    snap = published(cat, [endpoint(sim, "m-0")], media_hosts=[PUBLIC, "10.0.0.5", "*.media.example"])
    _, listeners, _, base = await start_router(snap)
    try:
        yield base
    finally:
        await listeners.close()


def chat(part: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}],
    }


async def post(base: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(base + path, json=body, headers=AUTH) as r:
        return r.status, await r.json()


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", "is not one the Cluster allows"),
        ("http://10.0.0.5:7070/api/v1/status", "10.0.0.5 is not a public address"),
        ("http://internal.example/x.png", "is not one the Cluster allows"),
        ("file:///etc/passwd", "a media URL must be data:"),
        ("http://93.184.215.14.nip.io@10.0.0.5/", "10.0.0.5 is not a public address"),
    ],
)
async def test_a_chat_media_url_into_the_node_network_is_refused(url: str, target: str, why: str) -> None:
    for kind in ("image_url", "video_url", "audio_url"):
        status, body = await post(url, "/v1/chat/completions", chat({"type": kind, kind: {"url": target}}))
        assert status == 400, body
        err = body["error"]
        assert err["code"] == "media_url_refused" and why in err["message"], err
        assert err["param"] == f"messages[0].content[1].{kind}.url"


async def test_responses_and_messages_media_urls_are_checked_as_well(url: str) -> None:
    responses = {
        "model": "m",
        "max_output_tokens": 2,
        "store": False,
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": "http://169.254.169.254/latest/"}],
            }
        ],
    }
    status, body = await post(url, "/v1/responses", responses)
    assert status == 400 and body["error"]["code"] == "media_url_refused", body
    messages = {
        "model": "m",
        "max_tokens": 2,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "url", "url": "http://10.0.0.5/a.png"}}],
            }
        ],
    }
    status, body = await post(url, "/v1/messages", messages)
    assert status == 400 and "10.0.0.5" in str(body), body


async def test_inline_media_and_allowed_public_hosts_are_served(url: str) -> None:
    for part in (
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "image_url", "image_url": {"url": f"https://{PUBLIC}/cat.png"}},
    ):
        status, body = await post(url, "/v1/chat/completions", chat(part))
        assert status == 200, body


def test_allowed_hosts_are_exact_names_or_beneath_a_wildcard() -> None:
    allowed = ["img.example.com", "*.media.example"]
    assert host_allowed("img.example.com", allowed) and host_allowed("IMG.example.com.", allowed)
    assert host_allowed("a.b.media.example", allowed)
    assert not host_allowed("media.example", allowed) and not host_allowed("evilmedia.example", allowed)
    assert not host_allowed("img.example.com.evil.net", allowed)
