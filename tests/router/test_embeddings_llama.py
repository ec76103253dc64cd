"""Embeddings against the real gemma model on llama.cpp's llama-server, through a real router with the official
openai client. llama-server is started with the command line the agent builds from a profile's `args`
(`embeddings: true, pooling: mean`), so what is tested is what a cluster repo would run."""

from __future__ import annotations

import math
from collections.abc import Iterator

import openai
import pytest
from fixtures.llama import ENGINE_KEY, require_llama, running_llama
from llmgw_agent.engines import LaunchContext, launch_plan
from llmgw_agent.protocol import ShardSpec
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator
from llmgw_router.path.service import Router, RouterOptions
from support import free_port

from llmgw.core.snapshot import RouterSnapshot
from llmgw.store.records import UsageRecord

from .test_integration import KEY_P1, keys

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

GEMMA_EMBEDDING_SIZE = 640  # gemma-3-270m's hidden size (its GGUF's gemma3.embedding_length)


@pytest.fixture(scope="module")
def llama_embedding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary, model = require_llama()
    workdir = tmp_path_factory.mktemp("llama-embed")
    port = free_port()
    spec = ShardSpec(
        replica_id="llama-embed-1",
        model="gemma",
        engine="llamacpp",
        context_length=1024,
        slots=1,
        args={"embeddings": True, "pooling": "mean"},
        api_key=ENGINE_KEY,
        served_model_name="gemma",
    )
    plan = launch_plan(spec, LaunchContext("127.0.0.1", port, model, str(workdir), binary))
    assert plan.argv[-3:] == ["--embeddings", "--pooling", "mean"]
    with running_llama(plan.argv, workdir / "llama.log", plan.env) as base:
        yield base


def gemma_embedding_snapshot(base: str) -> RouterSnapshot:
    return RouterSnapshot.model_validate(
        {
            "revision": "gemma-embed-1",
            "models": {"gemma": {"context_length": 1024, "capabilities": ["chat", "embeddings"]}},
            "tenants": {
                "organizations": {"acme": {}},
                "projects": {"p1": {"organization": "acme", "models": ["gemma"]}},
            },
            "endpoints": [
                {
                    "replica_id": "llama-embed-1",
                    "model": "gemma",
                    "engine": "llamacpp",
                    "base_url": base,
                    "api_key": ENGINE_KEY,
                    "slots": 1,
                }
            ],
        }
    )


class _Rows:
    def __init__(self) -> None:
        self.rows: list[UsageRecord] = []

    def record(self, rec: UsageRecord) -> None:
        self.rows.append(rec)


async def test_embeddings_on_gemma_through_the_router(llama_embedding: str) -> None:
    usage = _Rows()
    router = Router(RouterOptions(router_id="r1"), Authenticator(keys()), usage=usage)
    router.apply_snapshot(gemma_embedding_snapshot(llama_embedding))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
    try:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{listeners.api_port}/v1", api_key=KEY_P1, max_retries=0, timeout=120
        ) as c:
            # The client asks for base64 unless told otherwise and decodes it: both encodings are exercised.
            first = await c.embeddings.create(model="gemma", input="The cat sat on the mat.")
            again = await c.embeddings.create(
                model="gemma", input="The cat sat on the mat.", encoding_format="float"
            )
            batch = await c.embeddings.create(
                model="gemma", input=["The cat sat on the mat.", "Stock prices"]
            )
    finally:
        await listeners.close()
    vector = first.data[0].embedding
    assert len(first.data) == 1 and len(vector) == GEMMA_EMBEDDING_SIZE
    assert all(math.isfinite(x) for x in vector) and any(x != 0 for x in vector)
    assert first.usage.prompt_tokens > 0
    assert again.data[0].embedding == pytest.approx(vector, abs=1e-5), "the same input gives the same vector"
    assert [d.index for d in batch.data] == [0, 1]
    assert batch.data[0].embedding == pytest.approx(vector, abs=1e-5)
    assert batch.data[1].embedding != pytest.approx(vector, abs=1e-3), "another text, another vector"
    assert [(r.project, r.model, r.status, r.endpoint) for r in usage.rows] == [
        ("p1", "gemma", 200, "llama-embed-1")
    ] * 3
    assert usage.rows[0].tokens_in == first.usage.prompt_tokens and usage.rows[0].tokens_out == 0
    assert usage.rows[2].tokens_in == batch.usage.prompt_tokens > usage.rows[0].tokens_in
