"""The router in front of real sim engine processes, driven by the official openai client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.ratelimit import memory_limiter
from llmgw_router.path.service import Router, RouterOptions
from support import wait_for, write_bindings

from llmgw.adapters.keys import hash_key
from llmgw.core.config.secretrefs import SecretPolicy
from llmgw.core.snapshot import RouterSnapshot

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

KEY_P1 = "sk-llmgw-" + "a" * 43
KEY_P2 = "sk-llmgw-" + "b" * 43
KEY_LIMITED = "sk-llmgw-" + "c" * 43
KEY_REVOKED_UNKNOWN = "sk-llmgw-" + "d" * 43


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    procs = [start_sim("sim-chat", "engine-key-a"), start_sim("sim-chat", "engine-key-b")]
    try:
        wait_healthy_sync(procs)
        yield procs
    finally:
        for p in procs:
            p.kill()


def snapshot(sims: list[SimProcess], **overrides: Any) -> RouterSnapshot:
    raw: dict[str, Any] = {
        "revision": "test-1",
        "router": {"max_body_bytes": 100_000},
        "models": {
            "sim-chat": {
                "aliases": ["chat"],
                "context_length": 2048,
                "capabilities": ["chat", "completions", "embeddings"],
                "simulated": True,
            },
            "no-replicas": {"context_length": 2048, "fallbacks": ["sim-chat"]},
            "lazy": {"context_length": 2048, "on_demand": True},
            "other": {"context_length": 2048},
        },
        "tenants": {
            "organizations": {"acme": {}},
            "teams": {"research": {"organization": "acme"}},
            "projects": {
                "p1": {"team": "research", "models": ["sim-*", "no-replicas", "lazy"]},
                "p2": {"team": "research", "models": ["other"]},
                "limited": {"organization": "acme", "limits": {"rpm": 1}},
            },
        },
        "endpoints": [endpoint(sims[0], "rep-a"), endpoint(sims[1], "rep-b")],
    }
    raw.update(overrides)
    return RouterSnapshot.model_validate(raw)


def keys() -> StaticKeys:
    return StaticKeys.from_file_lines(
        [
            f"{hash_key(KEY_P1)} p1 key-1",
            f"{hash_key(KEY_P2)} p2 key-2",
            f"{hash_key(KEY_LIMITED)} limited key-3",
        ]
    )


class FakeController:
    def __init__(self) -> None:
        self.loads: list[str] = []

    def request_load(self, model: str) -> None:
        self.loads.append(model)


async def start_router(snap: RouterSnapshot, **opts: Any) -> tuple[Router, Listeners, FakeController]:
    controller = FakeController()
    router = Router(
        RouterOptions(on_demand_wait=opts.pop("on_demand_wait", 0.3), debug_token="dbg", **opts),
        auth=Authenticator(keys()),
        limiter=memory_limiter(lambda: __import__("time").time()),
        controller=controller,
    )
    router.apply_snapshot(snap)
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    return router, listeners, controller


@pytest.fixture
async def gateway(sims: list[SimProcess]) -> AsyncIterator[tuple[Router, str, FakeController]]:
    router, listeners, controller = await start_router(snapshot(sims))
    try:
        yield router, f"http://127.0.0.1:{listeners.api_port}", controller
    finally:
        await listeners.close()


def client(url: str, key: str = KEY_P1) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


async def test_chat_completions_embeddings_and_models(gateway: tuple[Router, str, FakeController]) -> None:
    router, url, _ = gateway
    async with client(url) as c:
        chat = await c.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert chat.model == "sim-chat"  # asked by alias, answered by the model's name
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.completion_tokens == 4
        comp = await c.completions.create(model="sim-chat", prompt="a b c", max_tokens=3)
        assert comp.choices[0].text and comp.usage is not None and comp.usage.completion_tokens == 3
        emb = await c.embeddings.create(model="sim-chat", input=["x y", "z"])
        assert len(emb.data) == 2 and len(emb.data[0].embedding) > 0
        models = await c.models.list()
        listed = {m.id: m for m in models.data}
    # p1 may use sim-chat, no-replicas and lazy; no-replicas cannot answer now (its fallback does not make it
    # listed), lazy is on demand; `other` is not allowed to p1.
    assert set(listed) == {"sim-chat", "lazy"}
    card = listed["sim-chat"].model_dump()
    assert card["owned_by"] == "llmgw-simulated" and card["context_length"] == 2048
    assert "embeddings" in card["capabilities"]
    tokens = router.metrics.registry.get_sample_value(
        "llmgw_router_tokens_total", {"model": "sim-chat", "direction": "completion"}
    )
    assert tokens == 7


async def test_streaming_passes_chunks_and_strips_the_usage_it_asked_for(
    gateway: tuple[Router, str, FakeController],
) -> None:
    router, url, _ = gateway
    async with client(url) as c:
        stream = await c.chat.completions.create(
            model="sim-chat",
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=5,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
        pieces = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert len(pieces.split()) == 5
        assert all(ch.choices for ch in chunks), (
            "the usage chunk the router asked for is not shown to the client"
        )
        with_usage = await c.chat.completions.create(
            model="sim-chat",
            messages=[{"role": "user", "content": "usage too"}],
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        last = [chunk async for chunk in with_usage][-1]
        assert last.usage is not None and last.usage.completion_tokens == 2
    completion = router.metrics.registry.get_sample_value(
        "llmgw_router_tokens_total", {"model": "sim-chat", "direction": "completion"}
    )
    assert completion == 7  # usage counted for both streams, asked for or not
    ttft = router.metrics.registry.get_sample_value(
        "llmgw_router_time_to_first_token_seconds_count", {"model": "sim-chat"}
    )
    assert ttft == 2


async def test_refusals_have_the_right_status_and_code(gateway: tuple[Router, str, FakeController]) -> None:
    _, url, _ = gateway
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {KEY_P1}", "Content-Type": "application/json"}
        async with s.post(url + "/v1/chat/completions", data=b"x" * 100_001, headers=headers) as r:
            assert r.status == 413 and (await r.json())["error"]["code"] == "request_too_large"
        async with s.post(url + "/v1/chat/completions", data=b"{not json", headers=headers) as r:
            err = (await r.json())["error"]
            assert r.status == 400 and err["code"] == "invalid_json"
            assert set(err) == {"message", "type", "param", "code"}
    async with client(url) as c:
        with pytest.raises(openai.NotFoundError) as nf:
            await c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        assert nf.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as long:
            await c.chat.completions.create(
                model="sim-chat", messages=[{"role": "user", "content": "word " * 2000}]
            )
        assert long.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError) as big_max:
            await c.chat.completions.create(
                model="sim-chat", messages=[{"role": "user", "content": "x"}], max_tokens=4000
            )
        assert big_max.value.code == "context_length_exceeded"
    for key, code in ((KEY_REVOKED_UNKNOWN, "invalid_api_key"), ("", "missing_api_key")):
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with s.post(
                url + "/v1/chat/completions", json={"model": "sim-chat", "messages": []}, headers=headers
            ) as r:
                assert r.status == 401 and (await r.json())["error"]["code"] == code
    async with client(url, KEY_P2) as c:
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await c.chat.completions.create(
                model="sim-chat", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
        assert denied.value.code == "model_not_allowed"


async def test_rate_limit_is_429_with_retry_after_and_ratelimit_headers(
    gateway: tuple[Router, str, FakeController],
) -> None:
    _, url, _ = gateway
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    headers = {"Authorization": f"Bearer {KEY_LIMITED}"}
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
            assert r.headers["x-ratelimit-limit-requests"] == "1"
            assert r.headers["x-ratelimit-remaining-requests"] == "0"
        async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            err = (await r.json())["error"]
            assert r.status == 429 and err["code"] == "rate_limit_exceeded"
            assert "rpm" in err["message"] or "requests" in err["message"]
            assert int(r.headers["Retry-After"]) >= 1
            assert r.headers["x-ratelimit-limit-requests"] == "1"


async def test_fallback_serves_and_says_so(gateway: tuple[Router, str, FakeController]) -> None:
    router, url, _ = gateway
    body = {"model": "no-replicas", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY_P1}", "x-llmgw-debug": "dbg"},
        ) as r,
    ):
        assert r.status == 200
        assert r.headers["x-llmgw-fallback"] == "sim-chat"
        assert (await r.json())["model"] == "sim-chat"
        assert "endpoint=rep-" in r.headers["x-llmgw-decision"]
    assert (
        router.metrics.registry.get_sample_value(
            "llmgw_router_fallbacks_total", {"model": "no-replicas", "fallback": "sim-chat"}
        )
        == 1
    )


async def test_on_demand_model_asks_for_a_load_then_503_loading(
    gateway: tuple[Router, str, FakeController],
) -> None:
    _, url, controller = gateway
    async with client(url) as c:
        with pytest.raises(openai.InternalServerError) as loading:
            await c.chat.completions.create(
                model="lazy", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
    assert loading.value.status_code == 503
    assert loading.value.code == "model_loading"
    assert "model is loading" in loading.value.message
    assert int(loading.value.response.headers["Retry-After"]) >= 1
    assert controller.loads == ["lazy"]


async def test_on_demand_request_is_served_when_the_replica_arrives(sims: list[SimProcess]) -> None:
    snap = snapshot(sims)
    router, listeners, controller = await start_router(snap, on_demand_wait=30.0)
    url = f"http://127.0.0.1:{listeners.api_port}"
    try:
        # The "lazy" model's replica is a sim engine serving under the name sim-chat; the router rewrites the
        # request's model to the endpoint's model, so point lazy's endpoint at a sim serving "lazy".
        from .helpers import start_sim

        lazy = start_sim("lazy", "k-lazy")
        try:
            wait_healthy_sync([lazy])
            async with client(url) as c:
                task = asyncio.create_task(
                    c.chat.completions.create(
                        model="lazy", messages=[{"role": "user", "content": "x"}], max_tokens=1
                    )
                )
                await wait_for(lambda: controller.loads == ["lazy"], 30, "the load request")
                eps = [*snap.model_dump(mode="json")["endpoints"], endpoint(lazy, "rep-lazy")]
                router.apply_snapshot(snapshot(sims, endpoints=eps, revision="test-2"))
                done = await task
            assert done.model == "lazy"
        finally:
            lazy.kill()
    finally:
        await listeners.close()


async def test_admission_queue_full_is_429_with_retry_after(sims: list[SimProcess]) -> None:
    slow = snapshot(
        sims,
        router={"max_body_bytes": 100_000, "admission": {"queue_size": 0, "timeout": "30s"}},
        endpoints=[endpoint(sims[0], "rep-a", slots=1)],
    )
    router, listeners, _ = await start_router(slow)
    url = f"http://127.0.0.1:{listeners.api_port}"
    try:
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"Bearer {KEY_P1}"}
            # The sim ends an answer by itself (a stop) after a few words: ignore_eos holds the first one for
            # its 2,000 tokens (2 s at 1 ms each), so it is in flight while the second is refused.
            long = {
                "model": "sim-chat",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 2000,
                "ignore_eos": True,
            }
            first = asyncio.create_task(s.post(url + "/v1/chat/completions", json=long, headers=headers))
            await wait_for(
                lambda: router.table is not None and router.table.endpoints["sim-chat"][0].inflight == 1,
                30,
                "the first request in flight",
            )
            short = dict(long, max_tokens=1, ignore_eos=False)
            async with s.post(url + "/v1/chat/completions", json=short, headers=headers) as r:
                assert r.status == 429
                assert (await r.json())["error"]["code"] == "queue_full"
                assert int(r.headers["Retry-After"]) >= 1
            resp = await first
            assert resp.status == 200
            resp.release()
        assert (
            router.metrics.registry.get_sample_value(
                "llmgw_router_admission_rejections_total", {"reason": "queue_full"}
            )
            == 1
        )
    finally:
        await listeners.close()


async def test_queued_request_waits_for_room_instead_of_failing(sims: list[SimProcess]) -> None:
    snap = snapshot(sims, endpoints=[endpoint(sims[0], "rep-a", slots=1)])
    _, listeners, _ = await start_router(snap)
    url = f"http://127.0.0.1:{listeners.api_port}"
    try:
        async with client(url) as c:
            results = await asyncio.gather(
                *(
                    c.chat.completions.create(
                        model="sim-chat", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=3
                    )
                    for i in range(4)
                )
            )
        assert all(r.usage is not None and r.usage.completion_tokens == 3 for r in results)
    finally:
        await listeners.close()


async def test_usage_records_name_the_project_key_and_tokens(sims: list[SimProcess]) -> None:
    from llmgw.store.records import UsageRecord

    records: list[UsageRecord] = []

    class Sink:
        def record(self, rec: UsageRecord) -> None:
            records.append(rec)

    router = Router(RouterOptions(router_id="r1"), Authenticator(keys()), usage=Sink())
    router.apply_snapshot(snapshot(sims))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        async with client(f"http://127.0.0.1:{listeners.api_port}") as c:
            await c.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        rec = records[-1]
        assert (rec.project, rec.team, rec.org, rec.key_id, rec.model, rec.status) == (
            "p1",
            "research",
            "acme",
            "key-1",
            "sim-chat",
            200,
        )
        assert rec.tokens_out == 2 and rec.tokens_in > 0 and rec.router_id == "r1"
    finally:
        await listeners.close()


async def test_engine_gets_its_own_key_never_the_clients(sims: list[SimProcess]) -> None:
    # An endpoint published with the wrong engine key is refused by the engine: proof the router sends the
    # engine key (and that the client's key, which the engine does not know, is not what got through above).
    snap = snapshot(sims, endpoints=[endpoint(sims[0], "rep-a", api_key="wrong")])
    _, listeners, _ = await start_router(snap)
    try:
        async with aiohttp.ClientSession() as s:
            body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
            async with s.post(
                f"http://127.0.0.1:{listeners.api_port}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {KEY_P1}"},
            ) as r:
                assert r.status == 401
                assert (await r.json())["error"]["code"] == "invalid_api_key"
    finally:
        await listeners.close()


async def test_a_plain_request_id_is_kept_and_anything_else_replaced(
    gateway: tuple[Router, str, FakeController],
) -> None:
    # The client's x-request-id goes to the engine, into logs and usage rows: only plain tokens pass.
    _, url, _ = gateway
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    async with aiohttp.ClientSession() as s:
        for sent, kept in (("trace-42.a:b_c", True), ("x" * 200, False), ("a b;c", False)):
            headers = {"Authorization": f"Bearer {KEY_P1}", "x-request-id": sent}
            async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                answered = r.headers["x-request-id"]
            assert (answered == sent) is kept
            if not kept:
                assert len(answered) == 32 and all(ch in "0123456789abcdef" for ch in answered)


async def test_health_ready_and_metrics_listener(sims: list[SimProcess]) -> None:
    router = Router(RouterOptions(operator_token="ops"), Authenticator(keys()))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    url = f"http://127.0.0.1:{listeners.api_port}"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                assert r.status == 200
            async with s.get(url + "/ready") as r:
                assert r.status == 503  # no snapshot yet
            router.apply_snapshot(snapshot(sims))
            async with s.get(url + "/ready", headers={"Authorization": "Bearer ops"}) as r:
                assert r.status == 200 and (await r.json())["revision"] == "test-1"
            async with s.get(url + "/metrics") as r:
                assert r.status == 404  # metrics live on their own listener only
            table = router.table
            assert table is not None
            await wait_for(lambda: all(ep.sample is not None for ep in table.all_endpoints()), 30, "a scrape")
            async with s.get(f"http://127.0.0.1:{listeners.metrics_port}/metrics") as r:
                text = await r.text()
        assert 'llmgw_router_endpoint_state{endpoint="rep-a",model="sim-chat",state="ready"} 1.0' in text
        assert 'llmgw_router_endpoint_running{endpoint="rep-a",model="sim-chat"}' in text
        assert 'llmgw_router_metrics_contract_violations{endpoint="rep-a",model="sim-chat"} 0.0' in text
        assert 'llmgw_router_snapshot_info{revision="test-1"} 1.0' in text
    finally:
        await listeners.close()


async def test_client_disconnect_cancels_the_upstream_request(sims: list[SimProcess]) -> None:
    slow = start_sim("sim-slow", "k-slow", decode_ms=50.0)
    snap = snapshot(
        sims,
        models={"sim-slow": {"context_length": 8192}},
        tenants={},
        endpoints=[endpoint(slow, "rep-slow")],
    )
    router, listeners, _ = await start_router(snap)
    url = f"http://127.0.0.1:{listeners.api_port}"
    try:
        wait_healthy_sync([slow])
        body = {
            "model": "sim-slow",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4000,
            "stream": True,
        }

        async def engine_running() -> float:
            async with aiohttp.ClientSession() as s, s.get(slow.base_url + "/metrics") as r:
                text = await r.text()
            line = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running"))
            return float(line.split()[-1])

        async with aiohttp.ClientSession() as s:
            resp = await s.post(
                url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY_P1}"}
            )
            assert resp.status == 200
            await resp.content.readany()  # the stream has started
            assert await engine_running() == 1
            resp.close()  # the client goes away ~200 s before the generation would end
        table = router.table
        assert table is not None
        await wait_for(lambda: table.endpoints["sim-slow"][0].inflight == 0, 30, "the router to let go")

        async def engine_idle() -> bool:
            return await engine_running() == 0

        await wait_for(engine_idle, 30, "the engine to drop the cancelled request")
    finally:
        await listeners.close()
        slow.kill()


async def test_external_provider_as_a_model_and_as_a_fallback(
    sims: list[SimProcess], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLMGW_SECRET_TEST_PROVIDER", sims[0].key)  # the provider (a sim) demands its key
    # The operator binds the key to the provider's host (llmgw.core.config.secret_bindings).
    write_bindings(tmp_path, ["$LLMGW_SECRET_TEST_PROVIDER: {purposes: [provider-key], hosts: [127.0.0.1]}"])
    models = snapshot(sims).model_dump(mode="json")["models"]
    models["ext"] = {
        "context_length": 2048,
        "provider": {
            "url": sims[0].base_url + "/v1",
            "model": "sim-chat",
            "key": {"env": "LLMGW_SECRET_TEST_PROVIDER"},
        },
    }
    models["no-replicas"]["fallbacks"] = ["ext"]
    snap = snapshot(sims, models=models, tenants={})
    router, listeners, _ = await start_router(snap, secrets=SecretPolicy(tmp_path))
    try:
        async with client(f"http://127.0.0.1:{listeners.api_port}") as c:
            direct = await c.chat.completions.create(
                model="ext", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
            assert direct.model == "ext"  # the provider's own name is not shown
            fb = await c.chat.completions.with_raw_response.create(
                model="no-replicas", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
            assert fb.headers["x-llmgw-fallback"] == "ext" and fb.parse().model == "ext"
            stream = await c.chat.completions.create(
                model="ext", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
            )
            assert {chunk.model async for chunk in stream} == {"ext"}
        # A provider URL at a metadata address is never called: that provider is dropped, the rest applies.
        bad = dict(
            models, ext=dict(models["ext"], provider={"url": "http://169.254.169.254/v1", "model": "m"})
        )
        router.apply_snapshot(snapshot(sims, models=bad, tenants={}))
        assert router.table is not None and router.table.endpoints["ext"] == ()
        assert "metadata" in router.provider_health.reported["ext"]
    finally:
        await listeners.close()


async def test_session_header_keeps_a_conversation_on_one_endpoint(sims: list[SimProcess]) -> None:
    snap = snapshot(
        sims,
        policies={"sticky": {"picker": "p2c", "weights": {"session": 10, "inflight": 1}}},
        router={"max_body_bytes": 100_000, "default_policy": "sticky"},
    )
    _, listeners, _ = await start_router(snap)
    url = f"http://127.0.0.1:{listeners.api_port}/v1/chat/completions"
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    try:
        chosen: dict[str, set[str]] = {"s1": set(), "s2": set(), "s3": set()}
        async with aiohttp.ClientSession() as s:
            for _ in range(5):
                for session in chosen:
                    headers = {
                        "Authorization": f"Bearer {KEY_P1}",
                        "x-llmgw-debug": "dbg",
                        "x-session-id": session,
                    }
                    async with s.post(url, json=body, headers=headers) as r:
                        assert r.status == 200
                        decision = r.headers["x-llmgw-decision"]
                        chosen[session].add(decision.split(";")[0].removeprefix("endpoint="))
                        assert "session_target=" in decision
        assert all(len(endpoints) == 1 for endpoints in chosen.values()), chosen
    finally:
        await listeners.close()


async def test_a_model_with_no_endpoint_and_no_fallback_is_503_model_unavailable(
    gateway: tuple[Router, str, FakeController],
) -> None:
    _, url, _ = gateway
    async with client(url, KEY_P2) as c:
        with pytest.raises(openai.InternalServerError) as err:
            await c.chat.completions.create(
                model="other", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
    assert err.value.status_code == 503 and err.value.code == "model_unavailable"
    assert err.value.response.headers["Retry-After"]


def test_static_snapshot_files_in_yaml_and_json(tmp_path: Path, sims: list[SimProcess]) -> None:
    from llmgw_router.main import load_snapshot_file

    snap = snapshot(sims)
    (tmp_path / "s.json").write_text(snap.model_dump_json())
    assert load_snapshot_file(tmp_path / "s.json") == snap
    (tmp_path / "s.yaml").write_text("revision: y\nmodels:\n  m: {context_length: 10}\n")
    assert load_snapshot_file(tmp_path / "s.yaml").models["m"].context_length == 10
    (tmp_path / "bad.yaml").write_text("models: {m: {}}\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: not a router snapshot"):
        load_snapshot_file(tmp_path / "bad.yaml")
