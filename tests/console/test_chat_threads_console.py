"""A signed-in person's chat is kept on a thread of theirs (issue 44): the first message starts one, the next goes
on it, the page reopens it, they delete it, and nobody else can write to it. Real controller, router, store and
engine (the sim, as an external provider the router calls), a person signed in with a password."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from controller.helpers import Repo, cluster_yaml, settings_for
from support import free_port, wait_for, write_bindings

from llmgw.adapters.keys import create_key
from llmgw.cli.deploy.up import LocalRouter, start_router
from llmgw.controller.app import RunningController, start_controller
from llmgw.controller.console.passwords import hash_password
from llmgw.controller.console.threads import answer_text
from llmgw.core.config.secretrefs import SecretPolicy

SIM_KEY_ENV = "LLMGW_SECRET_CHAT_THREADS_SIM"
PASSWORD = "a long enough password"


def tenants(sim_url: str) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Organization
metadata: {{name: acme}}
spec: {{}}
---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: playground}}
spec: {{organization: acme}}
---
apiVersion: llmgw/v1
kind: Person
metadata: {{name: ada}}
spec: {{email: ada@example.com, memberships: [{{project: playground}}]}}
---
apiVersion: llmgw/v1
kind: Person
metadata: {{name: bob}}
spec: {{email: bob@example.com, memberships: [{{project: playground}}]}}
---
apiVersion: llmgw/v1
kind: Model
metadata: {{name: sim-chat}}
spec:
  context_length: 2048
  provider: {{url: "{sim_url}/v1", model: sim-chat, key: {{env: {SIM_KEY_ENV}}}}}
"""


@dataclass
class Chat:
    running: RunningController
    router: LocalRouter
    key: str  # playground's API key

    @property
    def url(self) -> str:
        return self.running.url


@contextlib.contextmanager
def sim(key: str) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "llmgw_agent.sim", "--port", str(port), "--model", "sim-chat"]
    argv += ["--decode-ms-per-token", "1", "--prefill-ms-per-token", "0.01"]
    env = dict(os.environ, VLLM_API_KEY=key)
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture
async def chat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Chat]:
    monkeypatch.setenv(SIM_KEY_ENV, "the-sims-key")
    with sim("the-sims-key") as sim_url:
        repo = Repo(tmp_path / "repo", use_git=False)
        settings = settings_for(tmp_path, repo.path)
        write_bindings(
            Path(settings.secrets_dir), [f"${SIM_KEY_ENV}: {{purposes: [provider-key], hosts: [127.0.0.1]}}"]
        )
        repo.write({"cluster.yaml": cluster_yaml(), "tenants.yaml": tenants(sim_url)})
        running = await start_controller(settings)
        ctl = running.controller
        router = await start_router(
            "127.0.0.1:0",
            "127.0.0.1:0",
            running.url,
            ctl.router_token(),
            settings.store,
            secrets=SecretPolicy(Path(settings.secrets_dir)),
        )
        try:
            running.console.router_url = router.base_url
            await wait_for(
                lambda: ctl.desired is not None and "sim-chat" in ctl.desired.models, 15, "the repo applied"
            )
            for person in ("ada", "bob"):
                await ctl.store.set_password(person, hash_password(PASSWORD), ctl.wall())
            key = await create_key(ctl.store, "playground", ctl.wall(), name="chat")
            yield Chat(running, router, key.plaintext)
        finally:
            await router.close()
            await running.stop()


async def _person(c: Chat, name: str) -> tuple[aiohttp.ClientSession, str]:
    s = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with s.get(c.url + "/ui/login") as r:
        csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text())
    assert csrf is not None
    data = {"csrf": csrf.group(1), "person": name, "password": PASSWORD}
    async with s.post(c.url + "/ui/login/person", data=data) as r:
        page = await r.text()
    session_csrf = re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert r.status == 200 and session_csrf is not None, page
    return s, session_csrf.group(1)


async def _send(
    s: aiohttp.ClientSession, c: Chat, csrf: str, said: str, thread: str = ""
) -> tuple[int, str, str]:
    body = {
        "model": "sim-chat",
        "messages": [{"role": "user", "content": said}],
        "key": c.key,
        "thread": thread,
    }
    async with s.post(c.url + "/ui/chat/send", json=body, headers={"X-CSRF-Token": csrf}) as r:
        stream = await r.read()
        return r.status, r.headers.get("x-llmgw-thread", ""), answer_text(stream)


async def test_a_persons_exchanges_are_kept_on_their_thread(chat: Chat) -> None:
    c, store = chat, chat.running.controller.store
    ada, csrf = await _person(c, "ada")
    bob, bob_csrf = await _person(c, "bob")
    try:
        status, thread, first = await _send(ada, c, csrf, "hello there\nsecond line")
        assert status == 200 and thread.startswith("t-") and first, "an answer streamed on a new thread"
        kept = await store.thread("ada", thread)
        assert kept is not None and kept[0].title == "hello there"
        assert [(m.role, m.content) for m in kept[1]] == [
            ("user", "hello there\nsecond line"),
            ("assistant", first),
        ]

        status, same, second = await _send(ada, c, csrf, "and again", thread)
        assert (status, same) == (200, thread)
        kept = await store.thread("ada", thread)
        assert kept is not None and [m.content for m in kept[1]][2:] == ["and again", second]

        status, _, _ = await _send(bob, c, bob_csrf, "into ada's thread", thread)
        assert status == 404, "a thread is its owner's own"
        async with bob.post(f"{c.url}/ui/chat/threads/{thread}/delete", data={"csrf": bob_csrf}) as r:
            assert r.status == 404

        async with ada.get(c.url + "/ui/chat/threads") as r:
            assert r.status == 200 and f"/ui/chat?thread={thread}" in await r.text()
        async with ada.get(c.url + "/ui/chat", params={"thread": thread}) as r:
            assert '<script type="application/json" id="chat-thread">' in await r.text()
        async with ada.post(f"{c.url}/ui/chat/threads/{thread}/delete", data={"csrf": csrf}) as r:
            assert r.status == 200 and "No threads" in await r.text()
        assert await store.thread("ada", thread) is None
    finally:
        await ada.close()
        await bob.close()
