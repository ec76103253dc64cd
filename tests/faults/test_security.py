"""Security checks as tests: agents authenticate or are refused; engines refuse requests without their key;
keys are stored hashed; weight and provider URLs at link-local or metadata addresses are refused; and no
secret (admin token, API key, engine key, cluster secret) appears in logs, plans or errors of a real run."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from agent.test_mtls import issue
from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for, start
from fixtures.llama import LlamaServer
from llmgw_agent.protocol import PROTOCOL_VERSION
from llmgw_agent.weights import WeightsError, check_url
from llmgw_router.path.service import Router
from router.helpers import start_sim, wait_healthy_sync
from support import wait_for

from faults.cluster import Cluster
from faults.procs import http_status, start_router_following
from llmgw.adapters.keys import create_key, hash_key
from llmgw.adapters.repo_files import load_repo
from llmgw.core.security import engine_key, forbidden_address_reason
from llmgw.core.snapshot import RouterSnapshot
from llmgw.store import Store

KEY = "sk-llmgw-" + "s" * 43

FORBIDDEN_URLS = (
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/weights.gguf",
    "http://[fe80::1%25eth0]:8080/weights.gguf",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://metadata.google.internal./x",
    "http://[::ffff:169.254.169.254]/x",
    "http://[fd00:ec2::254]/x",
    "http://169.254.10.10:9000/model.gguf",
)


# ------------------------------------------------------------------ agents authenticate or are refused


async def _agent_hello(url: str, headers: dict[str, str], ctx: ssl.SSLContext) -> dict[str, object]:
    register = {
        "type": "register",
        "protocol_version": PROTOCOL_VERSION,
        "node": "node-a",
        "agent_version": "test",
        "inventory": {},
        "shards": [],
    }
    async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=headers, ssl=ctx) as ws:
        await ws.send_str(
            json.dumps(register)
        )  # a refusal may come before it is read: either way, one answer
        msg = await ws.receive(timeout=10)
        return dict(json.loads(msg.data)) if msg.type == aiohttp.WSMsgType.TEXT else {"closed": True}


@pytest.mark.integration
async def test_agents_need_a_token_and_a_client_certificate(tmp_path: Path) -> None:
    good = issue(tmp_path / "good") if (tmp_path / "good").mkdir() is None else {}
    other = issue(tmp_path / "other") if (tmp_path / "other").mkdir() is None else {}
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    settings = settings_for(
        tmp_path,
        repo.path,
        tls_cert=Path(good["server_cert"]),
        tls_key=Path(good["server_key"]),
        tls_client_ca=Path(good["ca"]),
    )
    running, _ = await start(settings)
    url = running.url.replace("https://", "wss://") + "/agent/v1"
    token = {"Authorization": "Bearer test-token"}

    def ctx(cert: dict[str, str] | None) -> ssl.SSLContext:
        c = ssl.create_default_context(cafile=good["ca"])
        if cert:
            c.load_cert_chain(cert["client_cert"], cert["client_key"])
        return c

    try:
        no_cert = await _agent_hello(url, token, ctx(None))
        assert no_cert["type"] == "refused" and "certificate" in str(no_cert["reason"])
        no_token = await _agent_hello(url, {}, ctx(good))
        assert no_token["type"] == "refused" and "Authorization" in str(no_token["reason"])
        wrong = await _agent_hello(url, {"Authorization": "Bearer nope"}, ctx(good))
        assert wrong == {"type": "refused", "reason": "wrong token"}
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            await _agent_hello(url, token, ctx(other))  # a certificate from another CA: no handshake
        welcome = await _agent_hello(url, token, ctx(good))
        assert welcome.get("type") == "welcome", welcome
    finally:
        await running.stop()


# ------------------------------------------------------------------ engines refuse requests without their key


@pytest.mark.integration
async def test_sim_engine_refuses_without_its_key() -> None:
    sim = start_sim("sim-key", "the-engine-key")
    try:
        await asyncio.to_thread(wait_healthy_sync, [sim])
        body = {"model": "sim-key", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with aiohttp.ClientSession() as s:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "the-engine-key"}):
                async with s.post(sim.base_url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 401, headers
                async with s.get(sim.base_url + "/v1/models", headers=headers) as r:
                    assert r.status == 401
            ok = {"Authorization": "Bearer the-engine-key"}
            async with s.post(sim.base_url + "/v1/chat/completions", json=body, headers=ok) as r:
                assert r.status == 200
    finally:
        sim.kill()


@pytest.mark.integration
@pytest.mark.llamacpp
def test_llama_server_refuses_without_its_key(llama_server: LlamaServer) -> None:
    base = llama_server.base  # started with LLAMA_API_KEY and --metrics, as the agent starts it
    for path in ("/v1/models", "/metrics"):
        assert http_status(base + path) == 401, path
        assert http_status(base + path, {"Authorization": "Bearer wrong"}) == 401, path
        assert http_status(base + path, {"Authorization": f"Bearer {llama_server.key}"}) == 200, path


# ------------------------------------------------------------------ keys hashed


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Store, Path | None]]:
    if request.param == "sqlite":
        path = tmp_path / "keys.db"
        opened = await Store.open(f"sqlite:///{path}")
        yield opened, path
    else:
        opened = await Store.open(request.getfixturevalue("pg_dsn"))
        yield opened, None
    await opened.close()


async def test_keys_are_stored_hashed(store: tuple[Store, Path | None]) -> None:
    db, path = store
    plaintexts = [(await create_key(db, "p1", time.time(), name=f"k{i}")).plaintext for i in range(3)]
    async with db.db.tx() as tx:
        rows = await tx.fetch("SELECT * FROM api_keys")
    dumped = json.dumps([list(map(str, r)) for r in rows])
    for key in plaintexts:
        assert key not in dumped and key[9:] not in dumped  # neither whole nor without its prefix
        assert hash_key(key) in dumped
        assert (await db.lookup_key(hash_key(key), time.time())) is not None
    if path is not None:  # the file itself and its write-ahead log, byte for byte
        raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
        assert hash_key(plaintexts[0]).encode() in raw
        assert not any(k.encode() in raw or k[9:].encode() in raw for k in plaintexts)


# ------------------------------------------------------------------ link-local and metadata addresses


@pytest.mark.parametrize("url", FORBIDDEN_URLS)
def test_forbidden_addresses_are_refused_everywhere(url: str, tmp_path: Path) -> None:
    # The pure check the controller, the validator and the router share.
    assert forbidden_address_reason(url) is not None
    # The agent refuses to fetch from it.
    with pytest.raises(WeightsError, match="refused"):
        check_url(url)
    # `llmgw validate` refuses it as a weights source and as a provider, naming file:line and the field.
    model = f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: bad}}
spec:
  context_length: 2048
  source: {{url: "{url}"}}
  profiles:
    - {{name: cpu, engine: llamacpp, cpu_cores: 1}}
---
apiVersion: llmgw/v1
kind: Model
metadata: {{name: bad-provider}}
spec:
  context_length: 2048
  provider: {{url: "{url}", model: x}}
"""
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "cluster.yaml").write_text(cluster_yaml())
    (repo / "models" / "bad.yaml").write_text(model)
    result = load_repo(repo)
    assert not result.ok
    text = "\n".join(str(e) for e in result.errors)
    assert "models/bad.yaml:6" in text and "spec.source.url" in text and "refused" in text, text
    assert "spec.provider.url" in text, text
    # The router never calls a provider that points there: it drops that provider alone (M11: the rest of
    # the snapshot still applies), marks the model unavailable and says why.
    snap = RouterSnapshot.model_validate(
        {"revision": "r", "models": {"m": {"context_length": 10, "provider": {"url": url, "model": "x"}}}}
    )
    router = Router()
    router.apply_snapshot(snap)
    assert router.table is not None and router.table.endpoints["m"] == ()
    assert "refused" in router.provider_health.reported["m"]


def test_ordinary_addresses_are_allowed() -> None:
    for url in (
        "http://10.0.0.5/w.gguf",
        "https://huggingface.co/x",
        "http://[2001:db8::1]/x",
        "http://127.0.0.1:8000",
    ):
        assert forbidden_address_reason(url) is None
        check_url(url)


# ------------------------------------------------------------------ no secret in logs, plans or errors


@pytest.mark.integration
async def test_no_secret_in_logs_plans_or_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    cluster = Cluster(tmp_path)
    secret = "cluster-secret-" + "q" * 40
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "cluster-secret").write_text(secret + "\n")  # settings_for's secrets_dir
    try:
        repo_cluster = cluster_yaml() + "  secret: {file: cluster-secret}\n"
        cluster.repo.write({"cluster.yaml": repo_cluster}, "cluster")
        admin = await cluster.start_controller()
        cluster.agents.start("n1", cluster.address)
        await wait_for(lambda: _node_ready(admin), 30, "n1 Ready")
        cluster.repo.write({"models/a.yaml": model_yaml("sim-a", min_=1)}, "add sim-a")
        ready = await cluster.wait_ready("sim-a", 1)
        ek = engine_key(secret.encode(), ready[0]["id"])

        router = start_router_following(tmp_path, [cluster.address], KEY)
        errors: list[str] = []
        try:
            async with openai.AsyncOpenAI(base_url=router.api + "/v1", api_key=KEY, max_retries=0) as client:

                async def served() -> bool:
                    try:
                        await client.completions.create(model="sim-a", prompt="x", max_tokens=2)
                        return True
                    except openai.APIError:
                        return False

                await wait_for(served, 30, "sim-a through the router")
            for wrong in (KEY[:-1] + "x", ek, "test-token"):
                async with openai.AsyncOpenAI(
                    base_url=router.api + "/v1", api_key=wrong, max_retries=0
                ) as bad:
                    with pytest.raises(openai.AuthenticationError) as caught:
                        await bad.completions.create(model="sim-a", prompt="x", max_tokens=2)
                    errors.append(json.dumps(caught.value.body))
            status = json.dumps(await admin.get("/api/v1/status"))
            replicas = json.dumps(await admin.get("/api/v1/replicas"))
            state = json.dumps(await admin.get("/api/v1/state"))
        finally:
            router.stop()
        plan = await asyncio.to_thread(  # a thread: the controller answering it runs on this loop
            subprocess.run,
            [
                str(Path(sys.executable).parent / "llmgw"),
                "plan",
                str(cluster.repo.path),
                "--format",
                "json",
                "--controller",
                cluster.running.url if cluster.running else "",
                "--token-file",
                str(tmp_path / "token"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        texts = {
            "controller log": caplog.text,
            "router log": router.text(),
            "agent log": "".join(p.read_text() for p in (tmp_path / "agents").glob("*/agent-*.log")),
            "error bodies": "\n".join(errors),
            "admin status/replicas/state": status + replicas + state,
            "plan": plan.stdout + plan.stderr,
        }
        assert plan.returncode in (0, 2), plan.stdout + plan.stderr
        secrets = {"API key": KEY, "engine key": ek, "cluster secret": secret, "admin token": "test-token"}
        for where, text in texts.items():
            assert text, f"nothing captured from the {where}"
            for what, value in secrets.items():
                assert value not in text, f"the {what} appears in the {where}"
    finally:
        await cluster.close()


async def _node_ready(admin: object) -> bool:
    return await admin.node_state("n1") == "Ready"  # type: ignore[attr-defined,no-any-return]
