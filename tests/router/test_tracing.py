"""Tracing the request path: one trace per request, the router's own, through its spans to the engine (which
is sent the router's upstream span as its parent), with the client's W3C traceparent kept as a link on the
root, never as its parent (L15, tests/security/test_l15_client_trace_context.py); checked with the OpenTelemetry SDK's
in-memory exporter; and a router process exporting over OTLP/HTTP to a receiver on loopback that decodes the
protobuf export request. Without an endpoint nothing of OpenTelemetry is loaded, and a client's traceparent
reaches the engine as it came."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from faults.procs import start_router_proc
from llmgw_router.app import serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.ratelimit import memory_limiter
from llmgw_router.path.service import Router, RouterOptions
from support import free_port, wait_for

from llmgw.adapters.keys import hash_key
from llmgw.adapters.tracing import otlp_tracer
from llmgw.core.snapshot import RouterSnapshot

pytest.importorskip("opentelemetry.sdk", reason="the llmgw[tracing] extra is not installed")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from .otlp_receiver import Receiver

pytestmark = pytest.mark.integration

KEY = "sk-llmgw-" + "t" * 43
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
REQUEST_SPANS = {"llmgw.request", "auth", "limits", "schedule", "upstream"}

CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class Engine:
    """An OpenAI-shaped engine on loopback in the test's loop that keeps the trace headers it was sent."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.traceparents.append(request.headers.get("traceparent"))
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(CHAT)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        delta = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
        await out.write(b"data: " + json.dumps(delta).encode() + b"\n\n")
        await out.write(b"data: " + json.dumps({"choices": [], "usage": CHAT["usage"]}).encode() + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        return out

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    async def start(self) -> Engine:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def snapshot(engine: Engine) -> dict[str, Any]:
    return {
        "revision": "trace-1",
        "models": {"m": {"context_length": 4096, "capabilities": ["chat"]}},
        "tenants": {
            "organizations": {"acme": {}},
            "projects": {"p1": {"organization": "acme", "limits": {"rpm": 1000}}},
        },
        "endpoints": [
            {
                "replica_id": "e1",
                "model": "m",
                "engine": "vllm",
                "base_url": f"http://127.0.0.1:{engine.port}",
                "api_key": "engine-key",
                "slots": 4,
            },
        ],
    }


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    e = await Engine().start()
    try:
        yield e
    finally:
        await e.stop()


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def _sampled_child_of(trace_id: str, span_id: str, sent: list[str | None]) -> bool:
    """Whether the engine was sent this span as a sampled parent (the flags' low bit; the SDK may set
    others, such as W3C level 2's random trace id flag)."""
    prefix = f"00-{trace_id}-{span_id}-"
    return any(t is not None and t.startswith(prefix) and int(t[len(prefix) :], 16) & 1 for t in sent)


async def test_one_trace_from_the_client_through_the_router_to_the_engine(engine: Engine) -> None:
    exporter = InMemorySpanExporter()
    tracer, shutdown = otlp_tracer("llmgw-router", None, processor=SimpleSpanProcessor(exporter))
    router = Router(
        RouterOptions(),
        auth=Authenticator(StaticKeys.from_file_lines([f"{hash_key(KEY)} p1 key-1"])),
        limiter=memory_limiter(time.time),
    )
    from llmgw_router.path.tracing import RequestTracer

    router.tracer = RequestTracer(tracer)
    router.apply_snapshot(RouterSnapshot.model_validate(snapshot(engine)))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{listeners.api_port}/v1", api_key=KEY, max_retries=0
        ) as client:
            headers = {"traceparent": CLIENT_TRACEPARENT}
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], extra_headers=headers
            )
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], stream=True, extra_headers=headers
            )
            async for _ in stream:
                pass
        await wait_for(
            lambda: len([s for s in exporter.get_finished_spans() if s.name == "llmgw.request"]) == 2,
            what="both requests' root spans",
        )
    finally:
        await listeners.close()
        shutdown()
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == "llmgw.request"]
    assert all(r.parent is None for r in roots), "each request starts a trace of the router's own"
    for root in roots:  # the client's span is a link: its trace can be found from ours
        assert [(_hex(k.context.trace_id, 32), _hex(k.context.span_id, 16)) for k in root.links] == [
            (TRACE_ID, CLIENT_SPAN)
        ]
    assert TRACE_ID not in {_hex(s.context.trace_id, 32) for s in spans}
    for root, streamed in zip(roots, (False, True), strict=True):
        trace_id = _hex(root.context.trace_id, 32)
        children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
        names = {s.name for s in children}
        assert {_hex(s.context.trace_id, 32) for s in children} == {trace_id}
        assert names == REQUEST_SPANS - {"llmgw.request"} | ({"stream"} if streamed else set()), names
        upstream = next(s for s in children if s.name == "upstream")
        # The engine's parent is the router's upstream span: the trace goes on into the engine.
        assert _sampled_child_of(trace_id, _hex(upstream.context.span_id, 16), engine.traceparents)
        assert upstream.attributes is not None and upstream.attributes["llmgw.endpoint"] == "e1"
        assert all(root.start_time <= s.start_time <= s.end_time <= root.end_time for s in children)
        assert root.attributes is not None and root.attributes["http.response.status_code"] == 200
    schedule = next(s for s in spans if s.name == "schedule")
    assert schedule.attributes is not None and schedule.attributes["llmgw.picker"] == "p2c"


async def test_without_tracing_the_clients_traceparent_reaches_the_engine_as_it_came(engine: Engine) -> None:
    router = Router(RouterOptions(), auth=Authenticator(None))
    router.apply_snapshot(RouterSnapshot.model_validate(snapshot(engine) | {"tenants": {}}))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{listeners.api_port}/v1", api_key="none", max_retries=0
        ) as client:
            for sent in (CLIENT_TRACEPARENT, "00-not-a-trace", None):
                headers = {"traceparent": sent} if sent else {}
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}], extra_headers=headers
                )
    finally:
        await listeners.close()
    assert router.tracer is None
    assert engine.traceparents == [CLIENT_TRACEPARENT, None, None], "a malformed one is not passed on"


def test_no_opentelemetry_module_is_loaded_without_an_endpoint() -> None:
    code = (
        "import sys, llmgw_router.main, llmgw_router.path.service, llmgw.controller.app, llmgw.cli.main\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


async def test_a_router_process_exports_its_spans_over_otlp_http(engine: Engine, tmp_path: Path) -> None:
    receiver = await Receiver().start()
    snap_file = tmp_path / "snapshot.json"
    snap_file.write_text(json.dumps(snapshot(engine)))
    keys = tmp_path / "keys"
    keys.write_text(f"{hash_key(KEY)} p1 key-1\n")
    args = [
        "--snapshot",
        str(snap_file),
        "--keys-file",
        str(keys),
        "--state-dir",
        str(tmp_path / "state"),
        "--otlp-endpoint",
        f"http://127.0.0.1:{receiver.port}",
    ]
    router = await asyncio.to_thread(start_router_proc, tmp_path / "router.log", args)
    try:
        async with openai.AsyncOpenAI(base_url=router.base_url, api_key=KEY, max_retries=0) as client:
            await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "x"}],
                extra_headers={"traceparent": CLIENT_TRACEPARENT},
            )
        # SIGTERM: the router flushes its batch of spans on the way out (the SDK's shutdown).
        assert await asyncio.to_thread(router.stop) == 0, router.text()[-3000:]
        await wait_for(lambda: receiver.names() >= REQUEST_SPANS, what="the spans exported")
    finally:
        router.kill()
        await receiver.stop()
    root = next(s for s in receiver.spans if s.name == "llmgw.request")
    assert root.parent == "" and root.trace_id != TRACE_ID, "a trace of the router's own, not the client's"
    ours = [s for s in receiver.spans if s.trace_id == root.trace_id]
    assert {s.service for s in ours} == {"llmgw-router"} and len(ours) == len(receiver.spans)
    assert {s.name for s in ours if s.parent == root.span_id} == REQUEST_SPANS - {"llmgw.request"}
    [upstream] = [s for s in ours if s.name == "upstream"]
    assert _sampled_child_of(root.trace_id, upstream.span_id, engine.traceparents)


async def test_a_refused_request_is_traced_up_to_the_step_that_refused_it(engine: Engine) -> None:
    exporter = InMemorySpanExporter()
    tracer, shutdown = otlp_tracer("llmgw-router", None, processor=SimpleSpanProcessor(exporter))
    router = Router(
        RouterOptions(),
        auth=Authenticator(StaticKeys.from_file_lines([f"{hash_key(KEY)} p1 key-1"])),
        limiter=memory_limiter(time.time),
    )
    from llmgw_router.path.tracing import RequestTracer

    router.tracer = RequestTracer(tracer)
    snap = snapshot(engine)
    snap["tenants"]["projects"]["p1"]["limits"] = {"rpm": 1}
    router.apply_snapshot(RouterSnapshot.model_validate(snap))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{listeners.api_port}/v1", api_key=KEY, max_retries=0
        ) as client:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    finally:
        await listeners.close()
        shutdown()
    spans = exporter.get_finished_spans()
    refused = next(
        s
        for s in spans
        if s.name == "llmgw.request" and (s.attributes or {}).get("http.response.status_code") == 429
    )
    assert (refused.attributes or {})["llmgw.error_code"] == "rate_limit_exceeded"
    below = {s.name for s in spans if s.parent is not None and s.parent.span_id == refused.context.span_id}
    assert below == {"auth", "limits"}, "traced up to the limits that refused it, and no further"
