"""H6 (with H7): no request stalls a router. With 512 anonymous connections from one address holding the
review's exploit (a head, then no body) and a 400 KB prompt in flight under an e-mail guardrail (the shape
that made the scan quadratic), an authenticated request from that same address is answered within the
suite's request deadline: a liveness check, not a timing assertion (benchmarks/listener_flood.py measures
the latency).

A router in the test's loop with the default listener settings, a sim engine process behind it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.service import Router, RouterOptions
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync
from support import wait_for

from llmgw.adapters.keys import hash_key
from llmgw.controller.wire.publisher import published_models
from llmgw.core.desired.repo import validate_files
from llmgw.core.snapshot import RouterSnapshot

pytestmark = pytest.mark.integration

KEY = "sk-llmgw-" + "h" * 43
IDLE = 512
PROMPT_BYTES = 400_000
DEADLINE_S = 30.0  # the suite's standard wait for one answer (support.wait_for's default)
STALLED = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 1000\r\n\r\n"

REPO = """
apiVersion: llmgw/v1
kind: Organization
metadata: {name: org}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: tenant}
spec: {organization: org}
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: sim-chat}
spec: {context_length: 4096, capabilities: [chat], profiles: [{name: sim, engine: sim}]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: pii}
spec:
  mode: redact
  pii: [email]
  attach: {projects: [tenant]}
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("sim-chat", "k-chat")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


def snapshot(sim: SimProcess) -> RouterSnapshot:
    result = validate_files({"repo.yaml": REPO.encode()})
    assert result.repo is not None, [str(e) for e in result.errors]
    cat = result.repo.catalog
    return RouterSnapshot.model_validate(
        {
            "revision": "h6",
            "models": {n: m.model_dump() for n, m in published_models(cat).items()},
            "tenants": cat.tenants().model_dump(),
            "guard": cat.published_guard().model_dump(),
            "endpoints": [endpoint(sim, "chat-1")],
        }
    )


def chat_request(text: str) -> bytes:
    body = json.dumps({"model": "sim-chat", "messages": [{"role": "user", "content": text}], "max_tokens": 4})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body.encode()


async def test_h6_an_authenticated_request_is_answered_under_a_flood_and_a_guarded_400kb_prompt(
    sim: SimProcess,
) -> None:
    keys = StaticKeys.from_file_lines([f"{hash_key(KEY)} tenant key-1"])
    router = Router(RouterOptions(router_id="h6"), Authenticator(keys))
    router.apply_snapshot(snapshot(sim))
    scans: list[int] = []
    screen = router.guard.screen_input

    async def screen_input(*args: Any) -> Any:  # a spy: tells the test the big prompt's scan has begun
        scans.append(len(json.dumps(args[1])))
        return await screen(*args)

    router.guard.screen_input = screen_input  # type: ignore[method-assign]
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    api, port = listeners.api, listeners.api_port
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(IDLE):  # the review's exploit, from the address the tenant uses too
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(STALLED)
            held.append((reader, writer))
        await wait_for(lambda: len(api.connections) + api.evicted >= IDLE, DEADLINE_S, "the flood accepted")

        _big_reader, big = await asyncio.open_connection("127.0.0.1", port)
        big.write(chat_request("a" * PROMPT_BYTES + "@"))
        await big.drain()
        await wait_for(lambda: any(n > PROMPT_BYTES for n in scans), DEADLINE_S, "the 400 KB prompt's scan")

        async with (
            openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=DEADLINE_S
            ) as client,
            asyncio.timeout(DEADLINE_S),
        ):
            answer = await client.chat.completions.create(
                model="sim-chat", messages=[{"role": "user", "content": "still there?"}], max_tokens=4
            )
        assert answer.choices[0].message.content, "an answer from the engine, through the router"
    finally:
        for _reader, writer in held:
            writer.close()
        await listeners.close()
