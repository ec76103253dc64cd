"""The two requests of a disaggregated request, as vLLM's P/D protocol has them (decisions/disagg.py), the
continuation of a decode that broke mid-stream, and the client's own `kv_transfer_params` never reaching an
engine (decisions/fields.py)."""

from __future__ import annotations

from llmgw_router.decisions.disagg import (
    continued_body,
    continued_event,
    decode_body,
    kv_host,
    near_kv,
    prefill_body,
    returned_params,
    streamed,
)
from llmgw_router.decisions.fields import plan_fields

SENT = {
    "model": "m-prefill",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_completion_tokens": 50,
    "n": 1,
    "temperature": 0.2,
}


def test_the_prefill_asks_one_token_whole_and_the_kv_kept_for_a_remote_decode() -> None:
    body = prefill_body(SENT)
    assert body["max_tokens"] == 1 and body["stream"] is False
    assert "stream_options" not in body and "max_completion_tokens" not in body and "n" not in body
    assert body["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert body["temperature"] == 0.2 and SENT["stream"] is True  # the request itself is left as it was


def test_the_decode_carries_what_the_prefill_returned() -> None:
    params = {
        "do_remote_prefill": True,
        "remote_engine_id": "e1",
        "remote_block_ids": [7],
        "remote_host": "10.0.0.2",
    }
    got = returned_params({"choices": [], "kv_transfer_params": params})
    assert got == params
    body = decode_body(SENT, got)
    assert (
        body["kv_transfer_params"] == params
        and body["stream"] is True
        and body["max_completion_tokens"] == 50
    )
    assert (
        returned_params({"kv_transfer_params": None}) is None
    )  # a connector that returns none (vLLM's example)
    assert kv_host(params) == "10.0.0.2" and kv_host({"remote_host": None}) is None
    on = [
        ("d1", "http://10.0.0.2:8001/v1"),
        ("d2", "http://10.0.0.3:8001/v1"),
        ("d3", "http://10.0.0.2:8002/v1"),
    ]
    assert near_kv(on, "10.0.0.2") == {"d1", "d3"} and near_kv(on, None) == frozenset()


def test_the_clients_own_kv_transfer_params_are_dropped() -> None:
    body = {"model": "m", "messages": [], "kv_transfer_params": {"do_remote_prefill": True}}
    plan = plan_fields("vllm", "chat", body, (), "p1", "key")
    assert plan is not None and plan.drop == ("kv_transfer_params",)


def _delta(**delta: object) -> dict[str, object]:
    return {"id": "c-1", "created": 5, "model": "m-decode", "choices": [{"index": 0, "delta": delta}]}


def test_a_broken_chat_stream_is_continued_from_its_text() -> None:
    given = streamed(
        [_delta(role="assistant", content=""), _delta(content="Once"), _delta(content=" upon"), None]
    )
    assert (given.text, given.tokens, given.continuable) == ("Once upon", 2, True)
    assert given.head == {"id": "c-1", "created": 5, "model": "m-decode"}
    sent = {**SENT, "kv_transfer_params": {"do_remote_prefill": True}}
    body = continued_body("chat", sent, given)
    assert body is not None and body["messages"][-1] == {"role": "assistant", "content": "Once upon"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_completion_tokens"] == 48 and "kv_transfer_params" not in body
    assert len(sent["messages"]) == 1  # the request itself is left as it was

    # Its events carry the first stream's id, time and model; its opening is dropped; its usage counts both.
    later = {"id": "c-2", "created": 9, "model": "m", "choices": [{"index": 0, "delta": {"content": " a"}}]}
    assert continued_event(later, given) == {**later, "id": "c-1", "created": 5, "model": "m-decode"}
    assert (
        continued_event({**later, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}, given) is None
    )
    usage = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    got = continued_event({"id": "c-2", "choices": [], "usage": usage}, given)
    assert got is not None and got["usage"] == {
        "prompt_tokens": 9,
        "completion_tokens": 5,
        "total_tokens": 14,
    }


def test_what_cannot_be_continued_is_said() -> None:
    call = _delta(tool_calls=[{"index": 0, "function": {"arguments": "{"}}])
    assert continued_body("chat", SENT, streamed([call])) is None  # a tool call half made
    two = {"choices": [{"index": 1, "delta": {"content": "b"}}]}
    assert continued_body("chat", SENT, streamed([_delta(content="a"), two])) is None  # several choices
    thinking = _delta(reasoning_content="hmm")
    assert continued_body("chat", SENT, streamed([thinking])) is None
    spent = streamed([_delta(content="x")] * 50)
    assert continued_body("chat", SENT, spent) is None  # its cap is spent
    text = streamed([{"choices": [{"index": 0, "text": " and"}]}])
    body = continued_body("completions", {"prompt": "cats", "max_tokens": 4}, text)
    assert body == {"prompt": "cats and", "max_tokens": 3}
    assert continued_body("completions", {"prompt": [1, 2], "max_tokens": 4}, text) is None
    nothing = continued_body("chat", SENT, streamed([_delta(role="assistant", content="")]))
    assert nothing is not None and nothing["messages"] == SENT["messages"]  # nothing streamed: asked again
    assert "continue_final_message" not in nothing
