"""Routing by verified capability, as pure decisions (llmgw_router.decisions.canary_route): which requests need a
probe, which endpoints may take them, what /v1/models lists, and the refusal's words and kind when no
endpoint of the chain is verified. The fleet test (test_model_check_fleet.py) shows the same through a real
router and controller."""

from __future__ import annotations

from llmgw_router.decisions.canary_route import listed_capabilities, needs_of, refusal, steered_away

from llmgw.core.snapshot import Endpoint, PublishedModel

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def ep(rid: str, model: str = "m", **kw: object) -> Endpoint:
    return Endpoint.model_validate(
        {"replica_id": rid, "model": model, "engine": "sim", "base_url": "http://x", **kw}
    )


def test_the_needs_of_a_request() -> None:
    assert needs_of({"messages": []}) == frozenset()
    assert needs_of({"tools": [TOOL]}) == {"tools"}
    assert needs_of({"tools": [TOOL], "tool_choice": "none"}) == frozenset()  # the model may not call them
    assert needs_of({"tools": []}) == frozenset()
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
    assert needs_of({"response_format": schema, "tools": [TOOL]}) == {"tools", "response_format"}
    assert needs_of({"response_format": {"type": "json_object"}}) == frozenset()  # not what the probe checks
    # Streams are not routed on usage: the router asks every stream for it.
    assert needs_of({"stream": True, "stream_options": {"include_usage": True}}) == frozenset()


def test_only_verified_endpoints_take_a_request_that_needs_a_capability() -> None:
    eps = {
        "m": [
            ep("never"),
            ep("failed", failed=["tools"]),
            ep("tools-only", verified=["tools"]),
            ep("both", verified=["tools", "response_format"]),
        ]
    }
    models = {"m": PublishedModel(context_length=10)}

    def away(needs: set[str]) -> frozenset[str]:
        return steered_away(
            eps, models, ("m",), headers={}, draw=0.5, needs=frozenset(needs), failed=frozenset()
        )

    assert away(set()) == frozenset()  # no need: every endpoint, checked or not
    assert away({"tools"}) == {"never", "failed"}
    assert away({"tools", "response_format"}) == {"never", "failed", "tools-only"}


def test_the_refusal_names_the_model_the_capability_the_state_and_what_to_do() -> None:
    tools = frozenset({"tools"})
    never = refusal({"m": [ep("a")]}, ("m",), tools)
    assert never is not None and not never.checking and never.param == "tools"
    assert never.message == (
        "No replica of `m` is verified for tools: it was never checked. The request is not sent where it could "
        "be answered wrongly; run `llmgw model check m` (docs/canaries.md, Model checks)."
    )
    hint = "the engine answers in text, not tool_calls — start vLLM with --enable-auto-tool-choice"
    failed = refusal({"m": [ep("a", failed=["tools"], failed_details={"tools": hint})]}, ("m",), tools)
    assert failed is not None and not failed.checking
    assert f"is verified for tools: the check failed: {hint}." in failed.message
    checking = refusal({"m": [ep("a", checking=True)]}, ("m",), tools)
    assert checking is not None and checking.checking
    assert "its model check is in progress; ask again in a few seconds" in checking.message
    schema = refusal({"m": [ep("a", verified=["tools"])]}, ("m",), frozenset({"response_format"}))
    assert schema is not None and schema.param == "response_format"
    assert "is verified for response_format: it was never checked" in schema.message


def test_a_fallback_that_was_verified_serves_and_the_refusal_names_the_whole_chain() -> None:
    tools = frozenset({"tools"})
    chain = ("m", "fb")
    assert refusal({"m": [ep("a")], "fb": [ep("b", "fb", verified=["tools"])]}, chain, tools) is None
    both = refusal({"m": [ep("a")], "fb": [ep("b", "fb")]}, chain, tools)
    assert both is not None and both.message.startswith("No replica of `m`, `fb` is verified for tools")


def test_v1_models_lists_a_probed_capability_only_once_verified() -> None:
    declared = ["chat", "tools", "embeddings"]
    assert listed_capabilities(declared, [ep("a"), ep("b", failed=["tools"])]) == ["chat", "embeddings"]
    assert listed_capabilities(declared, [ep("a"), ep("b", verified=["tools"])]) == declared
    assert listed_capabilities(declared, []) == ["chat", "embeddings"]
