"""M7 and M8: the router's front door. Only body size and JSON shape come before authentication; nothing about
the catalog is revealed to an anonymous client; JSON nested too deeply is a 400 with no traceback; a token that
cannot be a key costs the store nothing; the key cache forgets the least recently used key, not every key.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for, start
from llmgw_router.path.auth import Authenticator, StaticKeys, StoreKeys
from llmgw_router.server.errors import ApiError
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync
from support import free_port, wait_for, wait_until

from llmgw.adapters.keys import create_key, hash_key
from llmgw.core import jsonsafe
from llmgw.store import Store
from llmgw.store.records import KeyLookup

from .request_path import KEY, catalog, model, published, start_router, tenant_keys

pytestmark = pytest.mark.integration

DEEP = b"[" * 200_000 + b"]" * 200_000


@dataclass
class RouterProc:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("m", "engine-key-m")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def router_proc(sim: SimProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    """`llmgw-router --snapshot FILE --keys-file FILE` as a process, its log in a file."""
    tmp = tmp_path_factory.mktemp("edges")
    snap = published(catalog(model("m", context_length=64)), [endpoint(sim, "m-0")])
    (tmp / "snapshot.json").write_text(snap.model_dump_json())
    (tmp / "keys").write_text(f"{hash_key(KEY)} tenant key-1\n")
    port = free_port()
    log = tmp / "router.log"
    with log.open("ab") as handle:
        argv = [sys.executable, "-m", "llmgw_router", "--snapshot", str(tmp / "snapshot.json")]
        argv += ["--keys-file", str(tmp / "keys"), "--state-dir", str(tmp / "router-state")]
        argv += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{free_port()}"]
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT)
    router = RouterProc(proc, log, f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: _healthy(router.url) or proc.poll() is not None, 60, "router /health")
        assert proc.poll() is None, router.text()[-3000:]
        yield router
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def post(url: str, raw: bytes, key: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", data=raw, headers=headers) as r,
    ):
        return r.status, await r.json()


def chat(name: str, content: str = "x") -> bytes:
    return json.dumps({"model": name, "messages": [{"role": "user", "content": content}]}).encode()


# ---------------------------------------------------------------------------------------------- M7


@pytest.mark.parametrize(
    "raw",
    [
        chat("m", "word " * 400),  # exists, and far over its 64-token context: once a 400 naming the length
        chat("no-such-model"),  # once a 404 that told which names exist
        chat("m"),
        json.dumps({"messages": []}).encode(),  # no model at all
    ],
    ids=["over-context", "unknown-model", "existing-model", "no-model"],
)
async def test_m7_anonymous_request_is_401_before_any_model_lookup(
    router_proc: RouterProc, raw: bytes
) -> None:
    for key in (None, "sk-llmgw-" + "z" * 43):
        status, body = await post(router_proc.url, raw, key)
        assert status == 401, body
        assert body["error"]["code"] in ("missing_api_key", "invalid_api_key")
        assert "64" not in body["error"]["message"] and "model" not in body["error"]["message"]


async def test_m7_the_same_requests_with_a_key_get_the_catalog_answers(router_proc: RouterProc) -> None:
    # The order moved, not the answers: once authenticated, the precise errors are back.
    status, body = await post(router_proc.url, chat("m", "word " * 400), KEY)
    assert (status, body["error"]["code"]) == (400, "context_length_exceeded")
    status, body = await post(router_proc.url, chat("no-such-model"), KEY)
    assert (status, body["error"]["code"]) == (404, "model_not_found")


@pytest.mark.parametrize(
    "raw",
    [
        DEEP,
        b'{"model": "m", "messages": ' + b"[" * 500 + b"]" * 500 + b"}",
        b'{"model": "m", "x": '
        + b'{"a": ' * (jsonsafe.MAX_DEPTH + 1)
        + b"1"
        + b"}" * (jsonsafe.MAX_DEPTH + 1)
        + b"}",
    ],
    ids=["200000-arrays", "500-deep-messages", "one-past-the-limit"],
)
async def test_m7_deeply_nested_json_is_400_and_leaves_no_traceback(
    router_proc: RouterProc, raw: bytes
) -> None:
    for key in (None, KEY):  # before auth and after: the body's shape is checked first
        status, body = await post(router_proc.url, raw, key)
        assert (status, body["error"]["code"]) == (400, "invalid_json"), body
        assert f"deeper than {jsonsafe.MAX_DEPTH} levels" in body["error"]["message"]
    log = router_proc.text()
    assert "Traceback" not in log and "RecursionError" not in log and "internal_error" not in log


def test_m7_shared_loader_refuses_deep_nesting_as_a_value_error() -> None:
    # What the router, and the controller's reader of router messages, parse with.
    limit = jsonsafe.MAX_DEPTH
    assert jsonsafe.loads("[" * limit + "]" * limit) is not None
    assert jsonsafe.loads('"' + "[" * 1000 + '"') == "[" * 1000  # brackets inside a string are not nesting
    for text in ("[" * (limit + 1) + "]" * (limit + 1), DEEP):
        with pytest.raises(ValueError, match="nest deeper than"):
            jsonsafe.loads(text)


async def test_m7_controller_router_stream_survives_deep_and_non_object_messages(tmp_path: Path) -> None:
    # The controller reads routers' messages with the same loader: a message nested too deeply, or one that is
    # not an object, is dropped; the stream stays open and the next message is read.
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "a.yaml": model_yaml("sim-a", min_=0)})
    running, admin = await start(settings_for(tmp_path, repo.path))
    try:
        controller = running.controller
        await wait_for(lambda: controller.desired is not None, 10, "a revision applied")
        url = admin.url.replace("http://", "ws://") + "/router/v1"
        async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=admin.headers) as ws:
            await ws.receive(timeout=5)  # the first snapshot
            await ws.send_str(DEEP.decode())
            await ws.send_str("[1, 2]")
            await ws.send_str(json.dumps({"type": "usage", "models": ["sim-a"]}))
            await wait_for(
                lambda: controller.worker_state.model("sim-a").used_at is not None, 10, "use of sim-a noted"
            )
            assert not ws.closed
    finally:
        await running.stop()


# ---------------------------------------------------------------------------------------------- M8


class CountingStore:
    """A real SQLite store, counting the key lookups the router makes against it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lookups: list[str] = []

    async def lookup_key(self, key_hash: str, now: float) -> KeyLookup | None:
        self.lookups.append(key_hash)
        return await self.store.lookup_key(key_hash, now)


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    opened = await Store.open(f"sqlite:///{tmp_path / 'llmgw.db'}")
    try:
        yield opened
    finally:
        await opened.close()


async def test_m8_token_that_cannot_be_a_key_costs_no_store_query(sim: SimProcess, store: Store) -> None:
    real = (await create_key(store, "tenant", 0.0)).plaintext
    counting = CountingStore(store)
    snap = published(catalog(model("m")), [endpoint(sim, "m-0")])
    _, listeners, _, url = await start_router(snap, keys=StoreKeys(counting))
    try:
        for token in ["x", "Bearer-ish", "sk-" + "a" * 60, "sk-llmgw-short", "a" * 200]:
            status, body = await post(url, chat("m"), token)
            assert (status, body["error"]["code"]) == (401, "invalid_api_key"), token
        assert counting.lookups == []
        status, _ = await post(url, chat("m"), "sk-llmgw-" + "q" * 43)  # our shape, unknown: one query
        assert status == 401 and len(counting.lookups) == 1
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
        status, answer = await post(url, body.encode(), real)
        assert status == 200, answer
        assert len(counting.lookups) == 2
    finally:
        await listeners.close()


async def test_m8_key_cache_evicts_the_least_recently_used_not_everything(store: Store) -> None:
    real = (await create_key(store, "tenant", 0.0)).plaintext
    counting = CountingStore(store)
    auth = Authenticator(StoreKeys(counting, clock=lambda: 0.0), clock=lambda: 0.0, max_entries=4)
    assert (await auth.authenticate(f"Bearer {real}")).project == "tenant"
    for i in range(20):  # a flood of well-shaped unknown keys, while the real key keeps being used
        with pytest.raises(ApiError):
            await auth.authenticate(f"Bearer sk-llmgw-{i:043d}")
        assert (await auth.authenticate(f"Bearer {real}")).project == "tenant"
    assert counting.lookups.count(hash_key(real)) == 1  # never pushed out, never asked for again
    assert len(counting.lookups) == 21


async def test_m8_keys_file_keys_of_any_shape_keep_working() -> None:
    # An operator's keys file may hold the hash of any token; it is a dict lookup, so no shape check applies.
    token = "operator-chosen-token"
    auth = Authenticator(StaticKeys.from_file_lines([f"{hash_key(token)} tenant ops"]))
    assert (await auth.authenticate(f"Bearer {token}")).project == "tenant"
    assert (await Authenticator(tenant_keys()).authenticate(f"Bearer {KEY}")).project == "tenant"
