"""`llmgw model check`'s probes against the real llama.cpp llama-server with the tiny gemma base model: it
answers a json_schema response_format (llama.cpp constrains it with a grammar) and streams usage, and it
FAILS the tools probe (started without --jinja, a base model answers in text): a valid verdict, which says
what to change."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.llama import LlamaServer

from llmgw.controller.loops.evals import EngineTarget
from llmgw.controller.loops.model_checks import probe_target

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


def test_llama_server_verdicts(llama_server: LlamaServer) -> None:
    target = EngineTarget("gemma-r1", "gemma", llama_server.base, llama_server.key, "llamacpp")
    tools, fmt, usage = asyncio.run(probe_target(target, ["tools", "response_format", "stream_usage"]))
    assert not tools.passed
    assert tools.detail == (
        "the engine answers in text, not tool_calls — start llama-server with --jinja and a model whose chat "
        "template knows tools (an instruction-tuned model; a base model does not call tools)"
    )
    assert fmt.passed, fmt.detail
    assert usage.passed and usage.detail.startswith("ok: usage "), usage.detail
