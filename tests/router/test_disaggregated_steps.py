"""The two requests of a disaggregated request, as vLLM's P/D protocol has them (decisions/disagg.py), and the
client's own `kv_transfer_params` never reaching an engine (decisions/fields.py)."""

from __future__ import annotations

from llmgw_router.decisions.disagg import decode_body, kv_host, near_kv, prefill_body, returned_params
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
