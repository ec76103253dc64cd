"""The request path's pure rules (rules.py): sizing a request against a model, what a fallback may take,
the cap sent upstream, and the body an endpoint is sent."""

from __future__ import annotations

import json

import pytest
from llmgw_router.decisions.fields import FieldPlan
from llmgw_router.decisions.rules import Sizing, fits, parse, payload, sent_cap, session_key, size
from llmgw_router.server.errors import ApiError

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.snapshot import PublishedModel


def model(context: int = 1000, max_out: int | None = None) -> PublishedModel:
    return PublishedModel.model_validate(
        {"context_length": context, "max_output_tokens": max_out, "capabilities": ["chat", "completions"]}
    )


def test_size_reserves_what_was_asked_times_the_sequences() -> None:
    got = size(400, {"max_tokens": 20, "n": 3}, "chat", model())
    assert got == Sizing(prompt_estimate=110, completion_asked=20, completion_cap=20, sequences=3)
    assert got.completion_reserved == 60


def test_size_without_max_tokens_reserves_the_rest_of_the_context_or_the_models_cap() -> None:
    assert size(400, {}, "chat", model()).completion_cap == 1000 - 110
    assert size(400, {}, "chat", model(max_out=64)).completion_cap == 64
    assert size(400, {}, "completions", model()).completion_cap == 16  # the legacy API's default


def test_size_refuses_what_cannot_fit() -> None:
    with pytest.raises(ApiError) as too_long:
        size(4000, {"max_tokens": 10}, "chat", model())
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(ApiError) as over_cap:
        size(40, {"max_tokens": 100}, "chat", model(max_out=64))
    assert over_cap.value.code == "max_tokens_too_large"


def test_a_fallback_must_hold_the_prompt_and_what_was_asked() -> None:
    asked = Sizing(prompt_estimate=500, completion_asked=400, completion_cap=400)
    assert fits(model(1000), asked) and not fits(model(800), asked)
    assert not fits(model(1000, max_out=100), asked)
    unasked = Sizing(prompt_estimate=500, completion_cap=500)
    assert fits(model(501), unasked) and not fits(model(500), unasked)


def test_the_cap_sent_is_the_reservation_lowered_never_raised() -> None:
    unasked = Sizing(prompt_estimate=100, completion_cap=300)
    assert sent_cap(model(1000), unasked, provider=False) == 300
    assert sent_cap(model(300), unasked, provider=False) is None  # the context binds: the engine stops there
    assert sent_cap(model(300), unasked, provider=True) == 200  # a provider's context is not ours to know
    assert (
        sent_cap(model(1000), Sizing(100, 50, 50), provider=True) is None
    )  # the client's own cap goes as sent


def test_payload_is_the_clients_bytes_unless_something_must_change() -> None:
    raw = b'{"model": "m", "stream": true}'
    body = parse(raw)
    assert payload(raw, body, "m", None, None) is raw
    changed = json.loads(payload(raw, body, "upstream-m", 7, {}))
    assert changed == {
        "model": "upstream-m",
        "stream": True,
        "max_tokens": 7,
        "stream_options": {"include_usage": True},
    }


def test_session_key_prefers_the_header_then_the_user_then_the_first_messages() -> None:
    policy = RoutingPolicySpec.model_validate({"weights": {"session": 1.0}})
    header = policy.session.header
    assert session_key({header: "s1"}, {"user": "u"}, policy) == "s1"
    assert session_key({}, {"user": "u"}, policy) == "user:u"
    a = session_key({}, {"messages": [{"role": "user", "content": "hi"}]}, policy)
    assert a is not None and a.startswith("head:")
    assert session_key({}, {}, RoutingPolicySpec.model_validate({"weights": {"session": 0.0}})) is None


def test_fields_the_body_lacks_are_spliced_into_the_clients_bytes() -> None:
    raw = b'{"model": "m",  "messages": [{"role": "user", "content": "h\\u00e9"}], "stream": true}\n'
    body = parse(raw)
    sent = payload(raw, body, "m", 7, {}, FieldPlan((), "salt1"))
    # The client's bytes up to its closing brace, as they came (no re-encoding of the prompt) ...
    assert sent.startswith(raw[: raw.rindex(b"}")])
    # ... and the same request as re-encoding would have made.
    assert json.loads(sent) == {
        **body,
        "max_tokens": 7,
        "stream_options": {"include_usage": True},
        "cache_salt": "salt1",
    }
    assert (
        payload(b' {"model":"m"}\r\n', {"model": "m"}, "m", 3, None) == b' {"model":"m","max_tokens":3}\r\n'
    )


def test_a_body_that_must_change_in_place_or_is_not_utf8_is_encoded_again() -> None:
    raw = b'{"model":  "m", "stream_options": {"x": 1}, "max_tokens": null, "top_k": 3}'
    body = parse(raw)
    # A field it has (stream_options, a null max_tokens), a renamed model, a dropped field: re-encoded.
    for sent in (
        payload(raw, body, "m", None, {"x": 1}),
        payload(raw, body, "m", 7, None),
        payload(raw, body, "up", None, None),
        payload(raw, body, "m", None, None, FieldPlan(("top_k",), None)),
    ):
        assert not sent.startswith(b'{"model":  "m"'), sent  # json.dumps spells it with one space
    utf16 = '{"model": "m"}'.encode("utf-16-le")
    assert json.loads(payload(utf16, parse(utf16), "m", 5, None)) == {"model": "m", "max_tokens": 5}
