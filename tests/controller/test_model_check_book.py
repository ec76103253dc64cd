"""Model-check verdicts kept per model, engine and engine version, and read back from their stored JSON."""

from __future__ import annotations

import json

from llmgw.controller.parts.check_book import CheckBook, CheckVerdict
from llmgw.core.evals.model_checks import ProbeResult, probes_for


def test_verdicts_round_trip_and_say_which_probes_passed() -> None:
    tools = ProbeResult("tools", False, "the engine answers in text, not tool_calls — ...")
    fmt = ProbeResult("response_format", True, "ok: JSON valid against the schema")
    verdict = CheckVerdict("m", "vllm", "0.10.1", "m-r1", 5.0, (tools, fmt))
    book = CheckBook()
    assert book.load([json.dumps(verdict.json()), "{not json", json.dumps({"model": "x"})]) == 1
    assert book.verdicts[("m", "vllm", "0.10.1")] == verdict
    assert book.probes_of("m", "vllm", "0.10.1") == (["response_format"], ["tools"])
    assert book.probes_of("m", "vllm", "0.11.0") == ([], [])  # another version: never checked


def test_the_probes_follow_the_declared_capabilities() -> None:
    assert probes_for(["chat", "tools"]) == ["tools", "response_format", "stream_usage"]
    assert probes_for(["completions"]) == []
    assert probes_for(["tools"]) == ["tools"]
