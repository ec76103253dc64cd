"""A LoRA adapter on the real gemma model in llama.cpp's llama-server, through a real router and the official
openai client. The test writes a tiny GGUF-LoRA adapter for the base (tests/lora_gguf.py); the agent's fetch
path checks its sha256 and llama-server is started with the command line the agent builds for a shard that
carries it, so what runs is what an Adapter document would run."""

from __future__ import annotations

import asyncio
import hashlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from fixtures.llama import ENGINE_KEY, require_llama, running_llama
from llmgw_agent import weights
from llmgw_agent.engines import LaunchContext, launch_plan
from llmgw_agent.protocol import ShardAdapter, ShardSpec, WeightSource
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator
from llmgw_router.path.service import Router, RouterOptions
from lora_gguf import write_lora
from support import free_port

from llmgw.core.snapshot import RouterSnapshot

from .test_integration import KEY_P1, KEY_P2, keys

# A CPU engine on a shared machine: a few short generations may take minutes under load.
pytestmark = [pytest.mark.integration, pytest.mark.llamacpp, pytest.mark.timeout(900)]

ADAPTER = "gemma-pirate"
PROMPT = [{"role": "user", "content": "Say hi"}]


def _engine(base: str, path: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode() if body else None,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {ENGINE_KEY}"},
    )
    with urllib.request.urlopen(req, timeout=300) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def llama_lora(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    binary, model = require_llama()
    workdir = tmp_path_factory.mktemp("llama-lora")
    lora = workdir / "pirate.gguf"
    assert write_lora(Path(model), lora)
    digest = hashlib.sha256(lora.read_bytes()).hexdigest()
    spec = ShardSpec(
        replica_id="llama-lora-1",
        model="gemma",
        engine="llamacpp",
        context_length=1024,
        slots=1,
        api_key=ENGINE_KEY,
        served_model_name="gemma",
        adapters=[ShardAdapter(name=ADAPTER, source=WeightSource(path=str(lora), sha256=digest))],
    )
    # The agent's own fetch step: a path source is checked against its sha256 before anything runs.
    path = asyncio.run(weights.resolve(spec.adapters[0].source, workdir, lambda done, total: None))
    port = free_port()
    ctx = LaunchContext("127.0.0.1", port, model, str(workdir), binary, adapters=((ADAPTER, path),))
    plan = launch_plan(spec, ctx)
    assert plan.argv[-3:] == ["--lora", path, "--lora-init-without-apply"], plan.argv
    with running_llama(plan.argv, workdir / "llama.log", plan.env) as base:
        yield base, plan.argv


def snapshot(base: str) -> RouterSnapshot:
    return RouterSnapshot.model_validate(
        {
            "revision": "gemma-lora-1",
            "models": {"gemma": {"context_length": 1024, "capabilities": ["chat"]}},
            "adapters": {ADAPTER: {"base": "gemma", "projects": ["p1"]}},
            "tenants": {
                "organizations": {"acme": {}},
                "projects": {
                    "p1": {"organization": "acme", "models": ["gemma", ADAPTER]},
                    "p2": {"organization": "acme", "models": ["gemma", ADAPTER]},
                },
            },
            "endpoints": [
                {
                    "replica_id": "llama-lora-1",
                    "model": "gemma",
                    "engine": "llamacpp",
                    "base_url": base,
                    "api_key": ENGINE_KEY,
                    "slots": 1,
                    "adapters": [ADAPTER],
                }
            ],
        }
    )


async def test_an_adapter_is_listed_and_answered_by_the_real_engine(
    llama_lora: tuple[str, list[str]],
) -> None:
    base, _ = llama_lora
    # What the engine itself says with the adapter applied and without it (greedy, nothing cached).
    loaded = _engine(base, "/lora-adapters", {})
    assert [a["id"] for a in loaded] == [0], loaded  # type: ignore[index,union-attr]
    direct = {
        scale: _engine(
            base,
            "/v1/chat/completions",
            {
                "messages": PROMPT,
                "max_tokens": 4,
                "temperature": 0,
                "cache_prompt": False,
                "lora": [{"id": 0, "scale": scale}],
            },
        )["choices"][0]["message"]["content"]  # type: ignore[index]
        for scale in (0.0, 1.0)
    }
    assert direct[0.0] != direct[1.0], "the test adapter must change what the model says"
    router = Router(RouterOptions(), auth=Authenticator(keys()))
    router.apply_snapshot(snapshot(base))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    url = f"http://127.0.0.1:{listeners.api_port}/v1"
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key=KEY_P1, max_retries=0, timeout=300) as c:
            listed = {m.id: m.model_dump() for m in (await c.models.list()).data}
            assert set(listed) == {"gemma", ADAPTER}
            assert listed[ADAPTER]["parent"] == "gemma"
            card = (await c.models.retrieve(ADAPTER)).model_dump()
            assert card["id"] == ADAPTER
            ask = {"messages": PROMPT, "max_tokens": 4, "temperature": 0}
            adapted = await c.chat.completions.create(model=ADAPTER, **ask)  # type: ignore[call-overload]
            plain = await c.chat.completions.create(model="gemma", **ask)  # type: ignore[call-overload]
            again = await c.chat.completions.create(model=ADAPTER, **ask)  # type: ignore[call-overload]
        assert adapted.choices[0].message.content == direct[1.0]
        assert again.choices[0].message.content == direct[1.0]
        assert plain.choices[0].message.content == direct[0.0], "the base alone answers the base's requests"
        async with openai.AsyncOpenAI(base_url=url, api_key=KEY_P2, max_retries=0, timeout=300) as other:
            assert ADAPTER not in {m.id for m in (await other.models.list()).data}
            with pytest.raises(openai.PermissionDeniedError):
                await other.chat.completions.create(model=ADAPTER, messages=PROMPT, max_tokens=2)  # type: ignore[arg-type]
    finally:
        await listeners.close()
