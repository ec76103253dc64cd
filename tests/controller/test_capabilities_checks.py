"""Model-check results kept per probe (docs/router.md, Capabilities): a check that runs some probes replaces
those and keeps the others, so a capability declared after a key was checked is due by itself and never
hidden by the earlier verdict (issue 37: a verdict recorded for (model, engine, version) kept `tools`
unchecked after `tools` was declared)."""

from __future__ import annotations

import json

from llmgw.controller.parts.check_book import CheckBook, CheckVerdict
from llmgw.core.config.models import effective_capabilities
from llmgw.core.evals.model_checks import ProbeResult, probes_for

KEY = ("m", "sim", "unknown")
OK_FORMAT = ProbeResult("response_format", True, "ok: JSON valid against the schema")
OK_USAGE = ProbeResult("stream_usage", True, "ok: usage 8 completion tokens")
OK_TOOLS = ProbeResult("tools", True, "ok: a tool call, and the tool's result answered in words")
NO_TOOLS = ProbeResult("tools", False, "the engine answers in text, not tool_calls — ...")


def verdict(*probes: ProbeResult, at: float = 1.0) -> CheckVerdict:
    return CheckVerdict(*KEY, "m-r1", at, probes)


def test_every_chat_model_is_probed_for_tools_by_default() -> None:
    assert probes_for(effective_capabilities([], [])) == ["tools", "response_format", "stream_usage"]
    assert probes_for(effective_capabilities([], ["tools"])) == ["response_format", "stream_usage"]
    assert probes_for(effective_capabilities(["embeddings"], [])) == []


def test_a_newly_declared_capability_is_due_though_the_key_has_a_verdict() -> None:
    book = CheckBook()
    book.record(verdict(OK_FORMAT, OK_USAGE))  # checked while the model said `without: [tools]`
    before = probes_for(effective_capabilities([], ["tools"]))
    assert book.missing(*KEY, before) == [] and not book.checking(*KEY, before)
    after = probes_for(effective_capabilities([], []))  # `without` dropped: tools is served now
    assert book.missing(*KEY, after) == ["tools"]
    assert book.checking(*KEY, after)  # routers say "in progress", not "never checked"
    assert not CheckBook(auto=False).checking(*KEY, after)  # automatic checks off: nothing is due by itself


def test_a_check_of_some_probes_keeps_the_others() -> None:
    book = CheckBook()
    book.record(verdict(OK_FORMAT, OK_USAGE))
    kept = book.record(verdict(NO_TOOLS, at=2.0))
    assert kept.probes == (OK_FORMAT, OK_USAGE, NO_TOOLS) and kept.at == 2.0 and not kept.passed
    assert book.probes_of(*KEY) == (["response_format", "stream_usage"], ["tools"])
    assert book.details_of(*KEY) == {"tools": NO_TOOLS.detail}
    book.record(verdict(OK_TOOLS, at=3.0))  # the engine fixed, checked again: the new result replaces it
    assert book.probes_of(*KEY) == (["response_format", "stream_usage", "tools"], [])
    assert book.missing(*KEY, ["tools", "response_format", "stream_usage"]) == []


def test_the_merged_verdict_is_what_is_stored_and_read_back() -> None:
    book = CheckBook()
    book.record(verdict(OK_FORMAT))
    stored = book.record(verdict(OK_TOOLS, at=2.0))
    again = CheckBook()
    assert again.load([json.dumps(stored.json())]) == 1
    assert again.probes_of(*KEY) == (["response_format", "tools"], [])
