"""Stored responses (`store`, `previous_response_id`, retrieve, delete) through a real router on a real store
(SQLite and PostgreSQL) and a sim engine, driven by the official openai client. Content is kept only for
projects that opted in to content retention, sealed under the router's content key; TTLs are read on an
injected clock (no sleeping)."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from llmgw_router.app import build_router, serve
from llmgw_router.options import RouterOptions
from llmgw_router.path.service import RequestService

from llmgw.adapters import keys
from llmgw.core.snapshot import RouterSnapshot
from llmgw.store.store import Store

from .helpers import SIM_VERIFIED, SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

TTL_S = 3600.0
SECRET = "the word is periwinkle"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("sim-chat", "engine-key-s")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


def snapshot(sim: SimProcess) -> RouterSnapshot:
    keeps = {"organization": "o", "retention": {"content": True, "ttl": "1h"}}
    projects = {"keeper": keeps, "neighbour": keeps, "plain": {"organization": "o"}}
    return RouterSnapshot.model_validate(
        {
            "revision": "r1",
            "models": {"sim-chat": {"context_length": 4096, "capabilities": ["chat"], "simulated": True}},
            "tenants": {"organizations": {"o": {}}, "projects": projects},
            "endpoints": [endpoint(sim, "rep-a", verified=SIM_VERIFIED)],  # a tool call is asked
        }
    )


@dataclass
class Gateway:
    clients: dict[str, openai.AsyncOpenAI]  # by project
    now: list[float]  # the content clock: tests move it
    store: Store
    router: RequestService


@pytest.fixture
async def gateway(sim: SimProcess, store_dsn: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    key = os.urandom(32)
    now = [time.time()]
    async with contextlib.AsyncExitStack() as stack:
        store = await Store.open(store_dsn)
        stack.push_async_callback(store.close)
        made = {
            p: (await keys.create_key(store, p, time.time())).plaintext
            for p in ("keeper", "neighbour", "plain")
        }
        built = await build_router(
            stack,
            RouterOptions(),
            store=store_dsn,
            usage_spool=tmp_path / "spool",
            content_key=key,
            content_clock=lambda: now[0],
        )
        built.service.apply_snapshot(snapshot(sim))
        listeners = await serve(built.service, "127.0.0.1:0", "127.0.0.1:0", scrape=False)
        stack.push_async_callback(listeners.close)
        url = f"http://127.0.0.1:{listeners.api_port}/v1"
        clients = {}
        for project, plaintext in made.items():
            client = openai.AsyncOpenAI(base_url=url, api_key=plaintext, max_retries=0, timeout=60)
            stack.push_async_callback(client.close)
            clients[project] = client
        yield Gateway(clients, now, store, built.service)


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict), body
    return body.get("error", body)  # the client gives the error object itself or the whole body


async def test_a_stored_response_is_retrieved_continued_and_deleted(gateway: Gateway) -> None:
    c = gateway.clients["keeper"]
    first = await c.responses.create(model="sim-chat", input=SECRET, store=True, max_output_tokens=6)
    assert first.store is True and first.output_text
    got = await c.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.store is True
    assert (
        got.usage is not None
        and first.usage is not None
        and got.usage.input_tokens == first.usage.input_tokens
    )

    # Continuing prepends the kept input and output: the engine is sent more than the new turn alone.
    alone = await c.responses.create(model="sim-chat", input="and then?", store=False, max_output_tokens=2)
    assert alone.store is False
    second = await c.responses.create(
        model="sim-chat", input="and then?", previous_response_id=first.id, max_output_tokens=2
    )
    assert second.previous_response_id == first.id and second.store is True  # absent store: kept
    assert first.usage is not None and second.usage is not None and alone.usage is not None
    assert second.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens
    # A chain: the third turn carries both earlier turns.
    third = await c.responses.create(
        model="sim-chat", input="and then?", previous_response_id=second.id, max_output_tokens=2
    )
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens

    await c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as err:
        await c.responses.retrieve(first.id)
    assert error_of(err.value)["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as err:
        await c.responses.delete(first.id)
    with pytest.raises(openai.BadRequestError) as err:  # OpenAI's status for a response it does not hold
        await c.responses.create(model="sim-chat", input="x", previous_response_id=first.id)
    body = error_of(err.value)
    assert body["param"] == "previous_response_id" and body["code"] == "previous_response_not_found"
    assert body["type"] == "invalid_request_error" and first.id in body["message"]
    # What continued from it was kept whole: it still continues.
    fourth = await c.responses.create(
        model="sim-chat", input="x", previous_response_id=second.id, max_output_tokens=1
    )
    assert fourth.previous_response_id == second.id


async def test_content_is_sealed_at_rest(gateway: Gateway) -> None:
    c = gateway.clients["keeper"]
    kept = await c.responses.create(model="sim-chat", input=SECRET, max_output_tokens=3)
    assert kept.store is True  # store absent, project opted in: kept, as OpenAI's default says
    row = await gateway.store.content_row("response", "keeper", kept.id, gateway.now[0])
    assert row is not None
    created, expires, _, sealed = row
    assert expires - created == TTL_S  # the project's retention ttl
    raw = base64.b64decode(sealed)
    assert b"periwinkle" not in raw and kept.output_text.encode() not in raw


async def test_a_streamed_response_is_kept_once_the_stream_completes(gateway: Gateway) -> None:
    c = gateway.clients["keeper"]
    async with c.responses.stream(model="sim-chat", input="tell me", store=True, max_output_tokens=4) as s:
        events = [e async for e in s]
    # The sim writes up to the cap: the stream ends in response.incomplete, the Response in its event.
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.store is True and final.output_text == deltas and len(deltas.split()) == 4
    got = await c.responses.retrieve(final.id)
    assert got.output_text == final.output_text and got.status == final.status
    nxt = await c.responses.create(
        model="sim-chat", input="more", previous_response_id=final.id, max_output_tokens=1
    )
    assert nxt.previous_response_id == final.id


async def test_another_projects_key_gets_404_not_403(gateway: Gateway) -> None:
    mine, theirs = gateway.clients["keeper"], gateway.clients["neighbour"]
    kept = await mine.responses.create(model="sim-chat", input=SECRET, max_output_tokens=2)
    unknown = "resp_" + "0" * 48
    for rid in (kept.id, unknown):
        with pytest.raises(openai.NotFoundError) as err:
            await theirs.responses.retrieve(rid)
        assert error_of(err.value)["message"] == f"Response with id '{rid}' not found."
        with pytest.raises(openai.NotFoundError):
            await theirs.responses.delete(rid)
        with pytest.raises(openai.BadRequestError) as err:
            await theirs.responses.create(model="sim-chat", input="x", previous_response_id=rid)
        assert error_of(err.value)["message"] == f"Previous response with id '{rid}' not found."
    assert (
        await mine.responses.retrieve(kept.id)
    ).output_text == kept.output_text  # their delete did nothing


async def test_an_expired_response_is_404_on_the_injected_clock(gateway: Gateway) -> None:
    c = gateway.clients["keeper"]
    kept = await c.responses.create(model="sim-chat", input=SECRET, max_output_tokens=2)
    gateway.now[0] += TTL_S - 1
    assert (await c.responses.retrieve(kept.id)).id == kept.id
    gateway.now[0] += 2
    with pytest.raises(openai.NotFoundError) as err:
        await c.responses.retrieve(kept.id)
    assert error_of(err.value)["param"] == "response_id"
    with pytest.raises(openai.BadRequestError) as err:
        await c.responses.create(model="sim-chat", input="x", previous_response_id=kept.id)
    assert error_of(err.value)["code"] == "previous_response_not_found"


async def test_a_project_without_the_opt_in_keeps_nothing_and_says_why(gateway: Gateway) -> None:
    c = gateway.clients["plain"]
    served = await c.responses.create(model="sim-chat", input="hello", max_output_tokens=1)
    assert served.store is False  # store absent: served as before, nothing kept
    assert await gateway.store.content_row("response", "plain", served.id, gateway.now[0]) is None
    for extra, code in (
        ({"previous_response_id": served.id}, "previous_response_not_found"),  # what OpenAI answers
        ({"store": True}, "store_unsupported"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            await c.responses.create(model="sim-chat", input="x", **extra)
        body = error_of(err.value)
        assert body["code"] == code and body["param"] == next(iter(extra))
        assert "content-retention" in body["message"] and "project `plain`" in body["message"]
    with pytest.raises(openai.NotFoundError):
        await c.responses.retrieve(served.id)


async def test_a_store_that_refuses_the_write_answers_with_store_false(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw_router.surfaces.responses.keeper")
    c = gateway.clients["keeper"]
    async with gateway.store.db.tx() as tx:
        await tx.execute("ALTER TABLE content RENAME TO content_away")
    try:
        # Requests that neither keep nor continue never reach the content table: served, nothing warned.
        for project, extra in (("plain", {}), ("keeper", {"store": False})):
            served = await gateway.clients[project].responses.create(
                model="sim-chat", input="hello", max_output_tokens=1, **extra
            )
            assert served.store is False and served.output_text
        assert not [r for r in caplog.records if "stored responses" in r.getMessage()]
        for _ in range(2):
            answered = await c.responses.create(model="sim-chat", input="hello", max_output_tokens=2)
            assert answered.store is False and answered.output_text  # the answer is not lost, and says so
        with pytest.raises(openai.InternalServerError) as err:
            await c.responses.retrieve(answered.id)
        assert err.value.status_code == 503 and error_of(err.value)["code"] == "store_unavailable"
    finally:
        async with gateway.store.db.tx() as tx:
            await tx.execute("ALTER TABLE content_away RENAME TO content")
    kept = await c.responses.create(model="sim-chat", input="hello", max_output_tokens=2)
    assert kept.store is True and (await c.responses.retrieve(kept.id)).id == kept.id
    said = [r.getMessage() for r in caplog.records if "stored responses" in r.getMessage()]
    assert (
        len(said) == 2 and "cannot keep" in said[0] and "kept again" in said[1]
    )  # once, and when it cleared


async def test_a_project_that_withdrew_its_opt_in_reads_nothing(gateway: Gateway, sim: SimProcess) -> None:
    c = gateway.clients["keeper"]
    kept = await c.responses.create(model="sim-chat", input=SECRET, max_output_tokens=2)
    withdrawn = snapshot(sim).model_dump(mode="json")
    withdrawn["revision"], withdrawn["tenants"]["projects"]["keeper"]["retention"] = "r2", None
    gateway.router.apply_snapshot(RouterSnapshot.model_validate(withdrawn))
    with pytest.raises(openai.NotFoundError):
        await c.responses.retrieve(kept.id)
    with pytest.raises(openai.BadRequestError) as err:
        await c.responses.create(model="sim-chat", input="x", previous_response_id=kept.id)
    assert error_of(err.value)["code"] == "previous_response_not_found"
    served = await c.responses.create(model="sim-chat", input="x", max_output_tokens=1)
    assert served.store is False


LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
}


async def test_a_kept_tool_call_is_answered_with_only_its_output(gateway: Gateway) -> None:
    """The agent loop OpenAI's docs show: a function call kept, then only its output sent. The engine is sent
    the same conversation as when the client sends all of it."""
    c = gateway.clients["keeper"]
    first = await c.responses.create(model="sim-chat", input="what is a sim?", tools=[LOOKUP])
    call = first.output[0]
    assert first.store is True and call.type == "function_call"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "a simulated engine"}
    continued = await c.responses.create(
        model="sim-chat", tools=[LOOKUP], max_output_tokens=3, previous_response_id=first.id, input=[output]
    )
    whole = [
        {"role": "user", "content": [{"type": "input_text", "text": "what is a sim?"}]},
        {"type": "function_call", "call_id": call.call_id, "name": "lookup", "arguments": call.arguments},
        output,
    ]
    sent_whole = await c.responses.create(
        model="sim-chat", tools=[LOOKUP], max_output_tokens=3, store=False, input=whole
    )
    assert continued.output[0].type == "message" and len(continued.output_text.split()) == 3
    assert continued.usage is not None and sent_whole.usage is not None
    assert continued.usage.input_tokens == sent_whole.usage.input_tokens


def city_tool(name: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {"type": "function", "name": name, "parameters": params}


async def test_streamed_parallel_calls_are_kept_and_continued_with_only_their_outputs(
    gateway: Gateway,
) -> None:
    """The Agents SDK's loop with `previous_response_id`: two calls streamed and kept, then only their outputs
    sent; the engine is sent what it would be sent for the whole conversation."""
    c = gateway.clients["keeper"]
    tools: Any = [city_tool("get_weather"), city_tool("get_time")]
    ask = "In Paris: use get_weather and get_time."
    async with c.responses.stream(model="sim-chat", input=ask, tools=tools) as stream:
        final = await stream.get_final_response()
    assert final.store is True and [getattr(o, "name", None) for o in final.output] == [
        "get_weather",
        "get_time",
    ]
    kept = await c.responses.retrieve(final.id)

    def calls(output: list[Any]) -> list[tuple[str, str, str, str]]:
        return [(o.id, o.call_id, o.name, o.arguments) for o in output]

    assert calls(kept.output) == calls(final.output)
    outputs: Any = [
        {"type": "function_call_output", "call_id": o.call_id, "output": "fine"}  # type: ignore[union-attr]
        for o in final.output
    ]
    continued = await c.responses.create(
        model="sim-chat", tools=tools, max_output_tokens=3, previous_response_id=final.id, input=outputs
    )
    whole: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": ask}]},
        *(o.model_dump(exclude_none=True) for o in final.output),
        *outputs,
    ]
    sent_whole = await c.responses.create(
        model="sim-chat", tools=tools, max_output_tokens=3, store=False, input=whole
    )
    assert [o.type for o in continued.output] == ["message"]
    assert continued.output_text == sent_whole.output_text  # the sim's words are seeded by the prompt
    assert continued.usage is not None and sent_whole.usage is not None
    assert continued.usage.input_tokens == sent_whole.usage.input_tokens
