"""The capability rule as pure decisions (llmgw_router.decisions.capabilities; docs/router.md, Capabilities):
a request is forwarded unless the model is known not to serve what it needs — it lacks it (its kind, or
`without`), or every replica's model check failed it — and `verified_only` is opt-in. Each refusal has its
code and names the step that lifts it. The fleet tests (tests/controller/test_capabilities_fleet.py,
test_model_check_fleet.py) show the same through a real controller and router."""

from __future__ import annotations

from typing import Any

from llmgw_router.decisions.canary_route import steered_away
from llmgw_router.decisions.capabilities import lacked, needs_of, refusal, unsupported, usable

from llmgw.core.config.models import effective_capabilities
from llmgw.core.snapshot import Endpoint, PublishedModel

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
TOOLS = frozenset({"tools"})
IMAGE = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}
HINT = "the engine answers in text, not tool_calls — start vLLM with --enable-auto-tool-choice"


def ep(rid: str, model: str = "m", **kw: Any) -> Endpoint:
    return Endpoint.model_validate(
        {"replica_id": rid, "model": model, "engine": "sim", "base_url": "http://x", **kw}
    )


def published(
    declared: list[str] | None = None, without: list[str] | None = None, **kw: Any
) -> PublishedModel:
    caps = effective_capabilities(declared or [], without or [])
    return PublishedModel(context_length=10, capabilities=caps, without=without or [], **kw)


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
    # Images are looked for only when a model of the chain lacks vision.
    assert needs_of({"messages": [IMAGE]}) == frozenset()
    assert needs_of({"messages": [IMAGE]}, vision=True) == {"vision"}
    assert needs_of({"messages": [{"role": "user", "content": "hi"}]}, vision=True) == frozenset()


def test_declared_a_chat_model_serves_tools_unchecked() -> None:
    # Declaring nothing, or [tools]: the model serves chat and tools, and an unchecked replica takes them.
    for model in (published(), published(["tools"])):
        assert lacked(model, "chat", TOOLS) is None
    assert usable(ep("never"), TOOLS, verified_only=False)
    assert refusal({"m": [ep("never")]}, {"m": published()}, ("m",), TOOLS) is None


def test_added_capabilities_do_not_take_the_defaults_away() -> None:
    vision = published(["vision"])
    assert lacked(vision, "chat", frozenset({"tools", "vision"})) is None
    assert lacked(vision, "completions", frozenset()) is None
    embed = published(["embeddings"])  # an embedding model: its kind's endpoint only
    assert lacked(embed, "chat", frozenset()) == "chat"
    refused = unsupported("e", embed, "chat")
    assert (refused.code, refused.param, refused.status) == ("unsupported_capability", "model", 400)
    assert refused.message == (
        "Model `e` does not serve `chat`: it serves embeddings. Ask a model that serves it; if it does serve "
        "it, add `chat` to the model's `capabilities` (docs/router.md, Capabilities)."
    )


def test_negated_a_lacked_capability_is_refused_naming_the_without_to_remove() -> None:
    base = published(without=["tools", "vision"])
    assert lacked(base, "chat", frozenset()) is None  # plain chat is served
    assert lacked(base, "chat", TOOLS) == "tools"
    assert lacked(base, "chat", frozenset({"vision"})) == "vision"
    refused = unsupported("gemma", base, "tools")
    assert (refused.code, refused.param) == ("unsupported_capability", "tools")
    assert refused.message == (
        "Model `gemma` does not serve `tools`: the cluster repo says it lacks `tools` (`without: [tools]`). Ask "
        "a model that serves it; if it does serve it, remove `tools` from the model's `without` "
        "(docs/router.md, Capabilities)."
    )
    assert unsupported("gemma", base, "vision").param == "messages"


def test_failed_check_steers_away_and_refuses_only_when_every_replica_failed() -> None:
    eps = {
        "m": [
            ep("failed", failed=["tools"], failed_details={"tools": HINT}),
            ep("never"),
            ep("ok", verified=["tools"]),
        ]
    }
    models = {"m": published()}
    away = steered_away(eps, models, ("m",), headers={}, draw=0.5, needs=TOOLS, failed=frozenset())
    assert away == {"failed"}  # the unchecked one is not known to fail: it serves
    assert refusal(eps, models, ("m",), TOOLS) is None
    every = {"m": [ep("a", failed=["tools"], failed_details={"tools": HINT}), ep("b", failed=["tools"])]}
    refused = refusal(every, models, ("m",), TOOLS)
    assert refused is not None and (refused.code, refused.status, refused.param) == (
        "capability_check_failed",
        400,
        "tools",
    )
    assert refused.message == (
        f"No replica of `m` serves `tools`: the model check of its engine failed it: {HINT}. Fix that, then "
        "`llmgw model check m` records the new verdict and such requests are forwarded again; if the model cannot "
        "call tools, add `tools` to its `without` to refuse them up front (docs/router.md, Capabilities)."
    )
    # A json_schema answer the check failed: the same, without the `without` advice (it is part of chat).
    fmt = refusal(
        {"m": [ep("a", failed=["response_format"])]}, models, ("m",), frozenset({"response_format"})
    )
    assert fmt is not None and fmt.code == "capability_check_failed" and "without" not in fmt.message
    # A fallback whose check passed serves; the refusal names the whole chain.
    chain = {"m": [ep("a", failed=["tools"])], "fb": [ep("b", "fb")]}
    assert refusal(chain, {**models, "fb": published()}, ("m", "fb"), TOOLS) is None
    both = {"m": [ep("a", failed=["tools"])], "fb": [ep("b", "fb", failed=["tools"])]}
    refused = refusal(both, {**models, "fb": published()}, ("m", "fb"), TOOLS)
    assert refused is not None and refused.message.startswith("No replica of `m`, `fb` serves `tools`")
    assert refusal({"m": []}, models, ("m",), TOOLS) is None  # no endpoint at all: the scheduler's 503


def test_opt_in_verified_only_waits_for_a_passed_check() -> None:
    strict = {"m": published(verified_only=True)}
    eps = {"m": [ep("never"), ep("failed", failed=["tools"]), ep("ok", verified=["tools"])]}
    away = steered_away(eps, strict, ("m",), headers={}, draw=0.5, needs=TOOLS, failed=frozenset())
    assert away == {"never", "failed"}
    assert refusal(eps, strict, ("m",), TOOLS) is None
    never = refusal({"m": [ep("never")]}, strict, ("m",), TOOLS)
    assert never is not None and (never.code, never.status, never.checking) == (
        "capability_unverified",
        400,
        False,
    )
    assert never.message == (
        "`m` is `verified_only`: a request needing `tools` goes only to a replica whose model check passed it, and "
        "no replica of `m` was checked for it. Run `llmgw model check m` (or turn the controller's "
        "model_checks_auto on), or set `verified_only: false` on the model (docs/router.md, Capabilities)."
    )
    checking = refusal({"m": [ep("a", checking=True)]}, strict, ("m",), TOOLS)
    assert checking is not None and (checking.code, checking.status) == ("capability_unverified", 503)
    assert "its model check is in progress; ask again in a few seconds" in checking.message
    # Not opted in: the same unchecked or checking replica serves.
    assert refusal({"m": [ep("a", checking=True)]}, {"m": published()}, ("m",), TOOLS) is None


def test_each_need_may_have_a_replica_while_none_serves_both() -> None:
    strict = {"m": published(verified_only=True)}
    eps = {"m": [ep("a", verified=["tools"]), ep("b", verified=["response_format"])]}
    refused = refusal(eps, strict, ("m",), frozenset({"tools", "response_format"}))
    assert refused is not None and refused.code == "capability_unverified"
