"""M5: tenants' request bodies reach engines only through a per-engine allowlist, what is dropped is named in
the answer, and vLLM's prefix cache is salted per project by the router.

A real router process in front of stand-in engines (one announced as vLLM, one as llama.cpp) that record
every body they get and answer like an OpenAI chat completion.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from faults.procs import RouterProc, start_router_proc
from llmgw_router.decisions.fields import cache_salt

from llmgw.adapters.keys import hash_key
from llmgw.core.snapshot import RouterSnapshot

pytestmark = pytest.mark.integration

KEY_A = "sk-llmgw-" + "a" * 43
KEY_B = "sk-llmgw-" + "b" * 43
HOSTILE = {
    "chat_template": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "chat_template_kwargs": {"chat_template": "{{ 7*7 }}"},
    "kv_transfer_params": {"remote_host": "10.0.0.9"},
    "vllm_xargs": {"x": 1},
    "priority": -100,
    "id_slot": 0,
}


class RecordingEngine:
    """Records the JSON body of every completion request; serves the metric names the snapshot maps."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="t_running 0\nt_waiting 0\n", content_type="text/plain")

    async def __aenter__(self) -> RecordingEngine:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/{tail:.*}", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def _start(tmp: Path, engines: dict[str, RecordingEngine], allowed: list[str] | None = None) -> RouterProc:
    """A router with model `<engine>-m` served by each stand-in as that engine; keys for projects a and b."""
    snap: dict[str, Any] = {
        "revision": "fields",
        "router": {"allowed_request_fields": allowed or []},
        "models": {f"{name}-m": {"context_length": 4096} for name in engines},
        "endpoints": [
            {
                "replica_id": f"{name}-r1",
                "model": f"{name}-m",
                "engine": name,
                "base_url": f"http://127.0.0.1:{e.port}",
                "api_key": f"llmgw-ek-{name}-key",
                "slots": 4,
            }
            for name, e in engines.items()
        ],
        "metric_mappings": {name: {"running": "t_running", "waiting": "t_waiting"} for name in engines},
    }
    RouterSnapshot.model_validate(snap)
    (tmp / "snapshot.json").write_text(json.dumps(snap))
    (tmp / "keys").write_text(f"{hash_key(KEY_A)} a key-a\n{hash_key(KEY_B)} b key-b\n")
    args = ["--snapshot", str(tmp / "snapshot.json"), "--keys-file", str(tmp / "keys")]
    return start_router_proc(tmp / "router.log", args)


async def _chat(router: RouterProc, key: str, model: str, **extra: Any) -> tuple[int, dict[str, str]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            router.api + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as resp,
    ):
        await resp.read()
        return resp.status, dict(resp.headers)


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, RecordingEngine]]:
    async with RecordingEngine() as vllm, RecordingEngine() as llamacpp:
        yield {"vllm": vllm, "llamacpp": llamacpp}


async def test_m5_engine_extension_fields_are_dropped_and_named(
    tmp_path: Path, engines: dict[str, RecordingEngine]
) -> None:
    router = _start(tmp_path, engines)
    try:
        for name, engine in engines.items():
            status, headers = await _chat(router, KEY_A, f"{name}-m", **HOSTILE, top_k=5, temperature=0.1)
            assert status == 200
            got = engine.bodies[-1]
            assert not set(HOSTILE) & set(got), got
            assert got["top_k"] == 5 and got["temperature"] == 0.1  # sampling parameters pass
            assert headers["x-llmgw-dropped-fields"].split(",") == list(HOSTILE), headers
    finally:
        router.stop()


async def test_m5_nothing_dropped_means_no_header(
    tmp_path: Path, engines: dict[str, RecordingEngine]
) -> None:
    router = _start(tmp_path, engines)
    try:
        status, headers = await _chat(router, KEY_A, "llamacpp-m", temperature=0.5)
        assert status == 200 and "x-llmgw-dropped-fields" not in headers
        assert engines["llamacpp"].bodies[-1]["temperature"] == 0.5
    finally:
        router.stop()


async def test_m5_operator_allowed_fields_are_forwarded(
    tmp_path: Path, engines: dict[str, RecordingEngine]
) -> None:
    router = _start(tmp_path, engines, allowed=["chat_template_kwargs"])
    try:
        kwargs = {"enable_thinking": False}
        status, headers = await _chat(router, KEY_A, "vllm-m", chat_template_kwargs=kwargs, id_slot=1)
        assert status == 200
        assert engines["vllm"].bodies[-1]["chat_template_kwargs"] == kwargs
        assert headers["x-llmgw-dropped-fields"] == "id_slot"
    finally:
        router.stop()


async def test_m5_vllm_cache_salt_is_per_project_and_replaces_the_clients(
    tmp_path: Path, engines: dict[str, RecordingEngine]
) -> None:
    router = _start(tmp_path, engines)
    vllm = engines["vllm"].bodies
    try:
        await _chat(router, KEY_A, "vllm-m")
        await _chat(router, KEY_A, "vllm-m")
        # Project b tries to share project a's cache by sending a's salt.
        status, headers = await _chat(router, KEY_B, "vllm-m", cache_salt=vllm[0]["cache_salt"])
        assert status == 200 and headers["x-llmgw-dropped-fields"] == "cache_salt"
        await _chat(router, KEY_B, "vllm-m")
        await _chat(router, KEY_A, "llamacpp-m", cache_salt="x")
    finally:
        router.stop()
    salts = [b["cache_salt"] for b in vllm]
    assert salts[0] == salts[1]  # one salt per project: the project still hits its own cache
    assert salts[2] == salts[3] != salts[0]  # b's is its own, whatever b sent
    assert salts[0] == cache_salt("llmgw-ek-vllm-key", "a")  # keyed by the engine's key, not the bare name
    assert "cache_salt" not in engines["llamacpp"].bodies[-1]  # only vLLM knows the field
