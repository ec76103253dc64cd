"""`llmgw request ID` after real requests: a router process and a sim engine over the controller's store,
requests made with the official openai client, then the lookup through the controller's admin API (the row)
and through the router's own buffer (a request with no usage row)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from faults.procs import FakeEngine, RouterProc, start_router_proc
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync
from support import wait_for
from typer.testing import CliRunner

from llmgw.adapters import keys
from llmgw.adapters.repo_files import content_hash
from llmgw.cli.main import app as cli_app
from llmgw.store import Store

from .helpers import Repo, cluster_yaml, model_yaml, settings_for, start, status_if_applied

pytestmark = pytest.mark.integration

PRICE = 1_000_000.0  # one unit of money per token


def _snapshot(broken: FakeEngine, sim: SimProcess) -> dict[str, Any]:
    model = {"context_length": 8192, "capabilities": ["chat"], "simulated": True, "routing_policy": "rr"}
    return {
        "revision": "lookup-1",
        "router": {"scrape_interval": "200ms"},
        "models": {"sim-chat": model | {"prices": {"input_per_million": PRICE, "output_per_million": PRICE}}},
        "policies": {"rr": {"picker": "round_robin"}},
        "tenants": {"organizations": {"acme": {}}, "projects": {"web": {"organization": "acme"}}},
        # In id order round robin tries a-broken first: it answers 503, so the request is retried on b-live.
        "endpoints": [
            {
                "replica_id": "a-broken",
                "model": "sim-chat",
                "engine": "sim",
                "base_url": broken.base_url,
                "api_key": "k",
                "slots": 8,
            },
            endpoint(sim, "b-live"),
        ],
    }


def _broken_engine() -> FakeEngine:
    async def unavailable(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    return FakeEngine(behave={"/v1/chat/completions": unavailable, "/metrics": metrics}).start()


def _cli(args: list[str]) -> Any:
    return CliRunner(env={"LLMGW_TOKEN": "test-token", "COLUMNS": "200"}).invoke(cli_app, args)


async def _ready(metrics_url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(metrics_url + "/metrics") as r:
            page = await r.text()
    except aiohttp.ClientConnectionError:
        return False  # its metrics listener may open a moment after its API: wait_for's deadline decides

    return all(f'endpoint="{e}",model="sim-chat",state="ready"' in page for e in ("a-broken", "b-live"))


async def _key(dsn: str) -> str:
    store = await Store.open(dsn)
    try:
        return (await keys.create_key(store, "web", time.time())).plaintext
    finally:
        await store.close()


async def _router(tmp_path: Path, snapshot: dict[str, Any], args: list[str]) -> RouterProc:
    snap_file = tmp_path / "snapshot.json"
    snap_file.write_text(json.dumps(snapshot))
    argv = ["--snapshot", str(snap_file), "--state-dir", str(tmp_path / "router-state"), *args]
    return await asyncio.to_thread(start_router_proc, tmp_path / "router.log", argv)


async def test_llmgw_request_shows_the_decision_and_timings(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "m.yaml": model_yaml("sim-a", min_=0)})
    settings = settings_for(tmp_path, repo.path)
    sim = start_sim("sim-chat", "engine-key", decode_ms=5.0)
    broken = _broken_engine()
    running, admin = await start(settings)
    router = None
    try:
        await wait_for(lambda: status_if_applied(admin, content_hash(repo.path)), what="the repo applied")
        key = await _key(settings.store)
        await asyncio.to_thread(wait_healthy_sync, [sim])
        router = await _router(
            tmp_path, _snapshot(broken, sim), ["--store", settings.store, "--router-id", "r1"]
        )
        await wait_for(lambda: _ready(router.metrics), what="both endpoints scraped and ready")
        client = openai.AsyncOpenAI(base_url=router.base_url, api_key=key, max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="sim-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3, user="alice"
        )
        done = raw.parse()
        assert done.usage is not None
        request_id = raw.headers["x-request-id"]
        streamed = await client.chat.completions.with_raw_response.create(
            model="sim-chat", messages=[{"role": "user", "content": "a stream"}], max_tokens=4, stream=True
        )
        stream_id = streamed.headers["x-request-id"]
        async for _ in streamed.parse():
            pass
        await client.close()

        async def row(rid: str) -> Any:
            result = await asyncio.to_thread(_cli, ["request", rid, "--controller", running.url, "--json"])
            return json.loads(result.output) if result.exit_code == 0 else None

        [whole] = await wait_for(lambda: row(request_id), what="the request's usage row")
        [stream] = await wait_for(lambda: row(stream_id), what="the stream's usage row")
        readable = await asyncio.to_thread(_cli, ["request", request_id, "--controller", running.url])
        by_user = await asyncio.to_thread(
            _cli, ["usage", "--by", "tag:user", "--controller", running.url, "--json"]
        )
    finally:
        if router is not None:
            router.stop()
        await running.stop()
        broken.stop()
        sim.kill()
    assert (whole["status"], whole["model"], whole["endpoint"], whole["project"]) == (
        200,
        "sim-chat",
        "b-live",
        "web",
    )
    assert (whole["tokens_in"], whole["tokens_out"]) == (
        done.usage.prompt_tokens,
        done.usage.completion_tokens,
    )
    assert whole["cost"] == pytest.approx(
        (done.usage.prompt_tokens + done.usage.completion_tokens) * PRICE / 1e6
    )
    assert whole["attempts"] == [
        {"endpoint": "a-broken", "model": "sim-chat", "reason": "engine answered 503"}
    ], "the endpoint that failed first, and why"
    decision = whole["decision"]
    assert (decision["endpoint"], decision["picker"]) == ("b-live", "round_robin")
    assert [c["id"] for c in decision["candidates"]] == ["b-live"], "the retry's pick: a-broken excluded"
    assert decision["dropped"] == {"excluded": 1}
    assert whole["queue_ms"] is not None and whole["queue_ms"] >= 0
    assert whole["ttft_ms"] is None, "an answer sent whole has no first token time: unknown, not 0"
    assert whole["duration_ms"] > 0 and whole["tags"] == {"user": "alice"}
    assert stream["ttft_ms"] is not None and 0 < stream["ttft_ms"] <= stream["duration_ms"]
    assert stream["endpoint"] == "b-live" and stream["decision"]["endpoint"] == "b-live"
    assert readable.exit_code == 0, readable.output
    for words in ("b-live", "round_robin", "failed first", "a-broken", "engine answered 503", "picked"):
        assert words in readable.output, (words, readable.output)
    # The same store through the admin API's usage totals: the tagged request, and the untagged one as null.
    # stdout alone: the command names its source (the controller) on stderr, which the runner also collects.
    assert by_user.exit_code == 0, by_user.output
    assert {r["tag:user"]: r["requests"] for r in json.loads(by_user.stdout)} == {"alice": 1, None: 1}


async def test_a_request_with_no_usage_row_is_found_in_the_routers_buffer(tmp_path: Path) -> None:
    sim = start_sim("sim-chat", "engine-key")
    broken = _broken_engine()
    (tmp_path / "no-keys").write_text("# no key: every request here is a 401\n")
    operator = tmp_path / "operator-token"
    operator.write_text("ops-" + "t" * 40 + "\n")
    args = ["--keys-file", str(tmp_path / "no-keys"), "--operator-token-file", str(operator)]
    router = await _router(tmp_path, _snapshot(broken, sim), args)
    try:
        async with aiohttp.ClientSession() as s:
            body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}]}
            headers = {"x-request-id": "no-key-1", "Authorization": "Bearer sk-llmgw-" + "x" * 43}
            async with s.post(router.base_url + "/chat/completions", json=body, headers=headers) as r:
                assert r.status == 401 and r.headers["x-request-id"] == "no-key-1"
        lookup = ["--router", router.metrics, "--router-token-file", str(operator)]
        result = await asyncio.to_thread(_cli, ["request", "no-key-1", *lookup, "--json"])
        missing = await asyncio.to_thread(_cli, ["request", "never-made", *lookup])
        refused = await asyncio.to_thread(_cli, ["request", "no-key-1", "--router", router.metrics])
    finally:
        router.stop()
        broken.stop()
        sim.kill()
    assert result.exit_code == 0, result.output
    [seen] = json.loads(result.output)
    assert (seen["status"], seen["code"], seen["project"], seen["decision"]) == (
        401,
        "invalid_api_key",
        None,
        None,
    )
    assert missing.exit_code == 1 and "never-made" in missing.output
    # The admin token ($LLMGW_TOKEN) is never sent to a router: without the router's own token, no lookup.
    assert refused.exit_code == 1 and "--router-token-file" in refused.output
