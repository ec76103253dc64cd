"""A Messages round trip against the real gemma model on llama.cpp's llama-server: the translation meets an
engine's own chat answers and stream (finish reasons, its usage chunk), not only the sim's."""

from __future__ import annotations

import anthropic
import pytest
from fixtures.llama import ENGINE_KEY, LlamaServer
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator
from llmgw_router.path.service import Router, RouterOptions

from llmgw.core.snapshot import RouterSnapshot

from .test_integration import KEY_P1, keys

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


def gemma_snapshot(base: str) -> RouterSnapshot:
    return RouterSnapshot.model_validate(
        {
            "revision": "gemma-1",
            "models": {"gemma": {"context_length": 1024, "capabilities": ["chat"]}},
            "tenants": {
                "organizations": {"acme": {}},
                "projects": {"p1": {"organization": "acme", "models": ["gemma"]}},
            },
            "endpoints": [
                {
                    "replica_id": "llama-1",
                    "model": "gemma",
                    "engine": "llamacpp",
                    "base_url": base,
                    "api_key": ENGINE_KEY,
                    "slots": 1,
                }
            ],
        }
    )


async def test_a_messages_round_trip_on_gemma(llama_server: LlamaServer) -> None:
    llama = llama_server.base
    router = Router(RouterOptions(), Authenticator(keys()))
    router.apply_snapshot(gemma_snapshot(llama))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    question: anthropic.types.MessageParam = {"role": "user", "content": "Say hello in one short sentence."}
    try:
        async with anthropic.AsyncAnthropic(
            base_url=f"http://127.0.0.1:{listeners.api_port}", api_key=KEY_P1, max_retries=0, timeout=120
        ) as c:
            message = await c.messages.create(
                model="gemma",
                max_tokens=12,
                system="You are terse.",
                messages=[question],
                extra_body={"temperature": 0},
            )
            async with c.messages.stream(model="gemma", max_tokens=12, messages=[question]) as stream:
                text = "".join([piece async for piece in stream.text_stream])
                final = await stream.get_final_message()
    finally:
        await listeners.close()
    assert message.model == "gemma" and message.content and message.content[0].type == "text"
    assert message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 12
    assert text.strip() and final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.input_tokens > 0 and 0 < final.usage.output_tokens <= 12
