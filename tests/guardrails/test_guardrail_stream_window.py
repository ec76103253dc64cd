"""The sliding window of a screened stream: a phrase split across two events is still caught, the event that
tripped never reaches the client, and a warn is recorded once while the stream goes on. Driven through
GuardedStream with an in-memory client exchange (the Exchange protocol the listener implements); the same
path through a real router and sim engine is tests/guardrails/test_guardrail_router.py."""

from __future__ import annotations

import json

import pytest
from llmgw_router.path.guard_stream import GuardCut, GuardedStream
from llmgw_router.server.exchange import AS_SENT, Headers, HttpReply

from llmgw.core.config.specs.guardrail_spec import GuardrailSpec
from llmgw.core.evals import guardrails as gr


class Client:
    """What a client received: the stream's bytes, and whether it was ended."""

    method, path = "POST", "/v1/chat/completions"
    surface = AS_SENT

    def __init__(self) -> None:
        self.headers = Headers()
        self.sent = b""
        self.ended = False

    @property
    def remote(self) -> str | None:
        return "127.0.0.1"

    @property
    def started(self) -> bool:
        return True

    async def read_body(self, limit: int) -> bytes:
        return b""

    def respond(self, reply: HttpReply) -> None:
        raise AssertionError("a stream is not answered whole")

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        pass

    async def write(self, chunk: bytes, limit_s: float) -> None:
        assert not self.ended
        self.sent += chunk

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        self.sent += last
        self.ended = True

    def abort(self) -> None:
        pass


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def guard(mode: str, window: int = 16) -> gr.CompiledGuardrail:
    spec = GuardrailSpec(stages=["output"], mode=mode, keywords=["alpha theta"], window_chars=window)  # type: ignore[arg-type]
    return gr.compile_guardrail("g", spec)


async def test_a_phrase_split_across_events_is_cut_and_never_sent() -> None:
    client, counted = Client(), []
    stream = GuardedStream(client, (guard("block"),), counted.append)
    await stream.write(event("beta") + event(" alpha"), 1.0)
    with pytest.raises(GuardCut):
        await stream.write(event(" theta") + event(" iota"), 1.0)
    assert client.ended and stream.cut
    text = client.sent.decode()
    assert "theta" not in text and "iota" not in text  # the chunk that tripped was withheld
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "guardrail_blocked"
    assert [v.action for v in counted] == ["block"]


async def test_a_window_too_short_for_the_gap_does_not_see_the_phrase() -> None:
    client = Client()
    stream = GuardedStream(client, (guard("block", window=16),), lambda v: None)
    await stream.write(event(" alpha") + event(" " + "x" * 40), 1.0)  # alpha falls out of the window
    await stream.write(event(" theta"), 1.0)
    assert not stream.cut and not client.ended


async def test_warn_is_recorded_once_and_the_stream_goes_on() -> None:
    client, counted = Client(), []
    stream = GuardedStream(client, (guard("warn"),), counted.append)
    for piece in (" alpha", " theta", " alpha", " theta"):
        await stream.write(event(piece), 1.0)
    await stream.write_eof(1.0, b"data: [DONE]\n\n")
    assert client.sent.count(b"theta") == 2 and client.ended
    assert [v.action for v in counted] == ["warn"]
    assert stream.verdict is not None and stream.verdict.record()["rules"] == ["g/keyword"]
