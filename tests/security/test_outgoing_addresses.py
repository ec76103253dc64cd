"""M2: the router follows no redirects, and every connection it opens is checked on the address it goes to.

How a name that resolves to a forbidden address is made here, without DNS or /etc/hosts: getaddrinfo reads
legacy numeric IPv4 forms, so the host `2852039166` resolves (for real, through glibc) to 169.254.169.254,
the metadata address, while `ipaddress` and any check of the literal see no address in it. An endpoint's
base URL is reported by its agent and never passes the snapshot's literal check, so that is where such a
name reaches the router's connections (the engine client on the request path, aiohttp in the scrape loop).
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent.test_mtls import issue
from aiohttp import web
from aiohttp.abc import ResolveResult
from faults.procs import RouterProc, start_router_proc
from llmgw_router.path.service import Router
from llmgw_router.upstream.egress import ForbiddenAddress, client_connector
from llmgw_router.upstream.http1 import EngineClient, UpstreamHttpError

from llmgw.core.security import forbidden_address_reason
from llmgw.core.snapshot import RouterSnapshot

pytestmark = pytest.mark.integration

METADATA_AS_A_NUMBER = "2852039166"  # 169.254.169.254 to getaddrinfo


class Recorder:
    """A loopback HTTP server that records every request it gets and answers with `answer`."""

    def __init__(self, answer: web.Response | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.seen: list[str] = []
        self.answer = answer
        self.ssl_context = ssl_context
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _any(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(f"{request.method} {request.path}")
        await request.read()
        return self.answer or web.json_response({"stolen": "instance credentials"})

    async def __aenter__(self) -> Recorder:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def _snapshot(tmp: Path, models: dict[str, Any], endpoints: list[dict[str, Any]] | None = None) -> Path:
    snap = {"revision": "test", "models": models, "endpoints": endpoints or []}
    RouterSnapshot.model_validate(snap)
    path = tmp / "snapshot.json"
    path.write_text(json.dumps(snap))
    return path


@pytest.fixture
async def tls(tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    (tmp_path / "tls").mkdir()
    yield issue(tmp_path / "tls")


async def _chat(router: RouterProc, model: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with s.post(router.api + "/v1/chat/completions", json=body) as resp:
            return resp.status, await resp.json()


async def test_m2_provider_redirect_over_tls_is_not_followed(
    tmp_path: Path, tls: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The provider speaks TLS (so the router calls it through aiohttp, as it does real providers) with a
    # certificate from a test CA the router process trusts through SSL_CERT_FILE.
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tls["server_cert"], tls["server_key"])
    async with Recorder() as internal:
        redirect = web.Response(
            status=302,
            headers={"Location": f"http://127.0.0.1:{internal.port}/latest/meta-data/iam"},
            content_type="application/json",
            text='{"redirected": true}',
        )
        async with Recorder(redirect, server_ctx) as provider:
            snap = _snapshot(
                tmp_path,
                {
                    "ext": {
                        "context_length": 4096,
                        "provider": {"url": f"https://127.0.0.1:{provider.port}/v1", "model": "gpt-x"},
                    }
                },
            )
            monkeypatch.setenv("SSL_CERT_FILE", tls["ca"])
            router = start_router_proc(tmp_path / "router.log", ["--snapshot", str(snap), "--no-auth"])
            try:
                status, body = await _chat(router, "ext")
            finally:
                router.stop()
            assert provider.seen, "the provider was never called: the test proves nothing"
            assert status == 502, body
            assert body["error"]["code"] == "upstream_redirect"
            assert "follows no redirects" in body["error"]["message"]
            assert internal.seen == []  # the redirect's target got nothing


async def test_m2_plain_http_provider_redirect_is_an_error_not_relayed(tmp_path: Path) -> None:
    # An http:// provider goes through the lean engine client, which never follows: the 302 and its JSON
    # body must not be relayed to the tenant as the answer either.
    redirect = web.Response(
        status=302,
        headers={"Location": "http://169.254.169.254/latest/meta-data/"},
        content_type="application/json",
        text='{"id": "x", "choices": []}',
    )
    async with Recorder(redirect) as provider:
        snap = _snapshot(
            tmp_path,
            {
                "ext": {
                    "context_length": 4096,
                    "provider": {"url": f"http://127.0.0.1:{provider.port}/v1", "model": "m"},
                }
            },
        )
        router = start_router_proc(tmp_path / "router.log", ["--snapshot", str(snap), "--no-auth"])
        try:
            status, body = await _chat(router, "ext")
        finally:
            router.stop()
    assert provider.seen
    assert status == 502 and body["error"]["code"] == "upstream_redirect", body


async def test_m2_engine_name_resolving_to_metadata_is_refused_at_connect(tmp_path: Path) -> None:
    # The endpoint's base URL names no literal address; getaddrinfo resolves it to 169.254.169.254. The
    # request is refused as it connects (the router never sends to it) and says why. (The scrape of the
    # same URL goes through aiohttp, which refuses numeric forms in URLs itself.)
    endpoint = {
        "replica_id": "r1",
        "model": "m",
        "engine": "sim",
        "base_url": f"http://{METADATA_AS_A_NUMBER}:9",
        "slots": 4,
    }
    snap = _snapshot(tmp_path, {"m": {"context_length": 4096}}, [endpoint])
    router = start_router_proc(tmp_path / "router.log", ["--snapshot", str(snap), "--no-auth"])
    try:
        status, body = await _chat(router, "m")
    finally:
        router.stop()
    # One try, then the endpoint is excluded: the client gets 502 or 503, never an answer.
    assert status in (502, 503) and "error" in body, body
    refused = [line for line in router.text().splitlines() if "endpoint r1 (m) failed" in line]
    assert refused, router.text()[-2000:]
    assert "2852039166 (169.254.169.254) is a forbidden address" in refused[0], refused


class StandInDns(aiohttp.abc.AbstractResolver):
    """Stands in for DNS (which this machine lacks): answers every name with one address, as a rebinding
    name such as `169.254.169.254.nip.io` would. Everything after resolution is aiohttp's own."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        return [
            {
                "hostname": host,
                "host": self.address,
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        pass


async def test_m2_aiohttp_connections_check_the_resolved_address() -> None:
    # The router's aiohttp connector (providers, scrapes, the controller link) checks the address a name
    # resolved to, just before its socket connects.
    dns = StandInDns("169.254.169.254")
    async with aiohttp.ClientSession(connector=client_connector(dns)) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await session.get("http://imds.example.test/latest/meta-data/")
    assert dns.asked == ["imds.example.test"]
    assert isinstance(caught.value.os_error, ForbiddenAddress)
    assert "169.254.169.254 is a cloud metadata service address" in str(caught.value.os_error)


async def test_m2_engine_client_checks_the_resolved_address() -> None:
    client = EngineClient(connect_timeout=2.0, read_timeout=2.0)
    try:
        with pytest.raises(UpstreamHttpError, match=r"forbidden address.*169\.254\.169\.254"):
            await client.post(f"http://{METADATA_AS_A_NUMBER}:80/v1/chat/completions", b"{}", {})
    finally:
        client.close()


async def test_m2_aiohttp_connections_to_allowed_addresses_still_work() -> None:
    async with Recorder() as provider:
        dns = StandInDns("127.0.0.1")
        url = f"http://provider.example.test:{provider.port}/v1/models"
        async with (
            aiohttp.ClientSession(connector=client_connector(dns)) as session,
            session.get(url) as resp,
        ):
            assert resp.status == 200
    assert provider.seen == ["GET /v1/models"]


async def test_m2_loopback_engines_still_connect() -> None:
    # The check refuses only forbidden addresses: a name resolving to loopback connects as before.
    async with Recorder() as engine:
        client = EngineClient(connect_timeout=2.0, read_timeout=2.0)
        try:
            async with await client.post(
                f"http://localhost:{engine.port}/v1/chat/completions", b"{}", {}
            ) as r:
                assert r.status == 200 and b"stolen" in await r.read()
        finally:
            client.close()
    assert engine.seen == ["POST /v1/chat/completions"]


@pytest.mark.parametrize("host", [METADATA_AS_A_NUMBER, "0251.0376.0251.0376", "169.254.43518", "0xa9fea9fe"])
def test_m2_numeric_forms_of_the_metadata_address_are_refused_in_the_snapshot(host: str) -> None:
    assert forbidden_address_reason(f"https://{host}/v1") is not None
    snap = RouterSnapshot.model_validate(
        {
            "revision": "t",
            "models": {
                "ext": {"context_length": 10, "provider": {"url": f"https://{host}/v1", "model": "m"}}
            },
        }
    )
    router = Router()
    router.apply_snapshot(snap)  # the provider is dropped alone (M11), never called
    assert router.table is not None and router.table.endpoints["ext"] == ()
    assert "169.254.169.254 is a cloud metadata" in router.provider_health.reported["ext"]
