"""M11: one unreadable provider key drops that provider alone; the rest of the revision still applies.

Before, the router refused the whole snapshot, so a revision that took a model away from a project (or cut
its limits) and also added a provider whose key file was missing left the router on the old policy.
A real controller follows a repo directory; a real router process follows the controller.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import openai
import pytest
from aiohttp import web
from controller.helpers import Repo, cluster_yaml, settings_for, start
from faults.procs import FakeEngine, start_router_proc
from support import wait_for, write_bindings

from llmgw.adapters.keys import hash_key

KEY = "sk-llmgw-m11-test-key-0123456789abcdef"


def _provider(name: str, engine: FakeEngine, key: str, context: int = 2048) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  context_length: {context}
  provider: {{url: "{engine.base_url}/v1", model: up, key: {key}}}
"""


def _tenants(models: list[str]) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Organization
metadata: {{name: acme}}
spec: {{}}
---
apiVersion: llmgw/v1
kind: Team
metadata: {{name: research}}
spec: {{organization: acme}}
---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: p1}}
spec: {{team: research, models: {models}}}
"""


async def _chat(request: web.Request) -> web.StreamResponse:
    return web.json_response(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "up",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


async def _status(client: openai.OpenAI, model: str) -> int:
    """The status of one chat request, sent from a thread (the controller runs on this event loop)."""
    return await asyncio.to_thread(_status_sync, client, model)


def _status_sync(client: openai.OpenAI, model: str) -> int:
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


async def _is(client: openai.OpenAI, model: str, status: int) -> bool:
    return await _status(client, model) == status


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return str(r.read().decode())


@pytest.mark.integration
async def test_m11_bad_provider_key_drops_only_that_provider_and_the_new_allowlist_applies(
    tmp_path: Path,
) -> None:
    engine = FakeEngine(behave={"/v1/chat/completions": _chat}).start()
    router_secrets = tmp_path / "router-secrets"
    router_secrets.mkdir()
    (router_secrets / "good-key").write_text("good\n")
    bound = "{purposes: [provider-key], hosts: [127.0.0.1]}"
    write_bindings(router_secrets, [f"good-key: {bound}", f"missing-key: {bound}"])
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write(
        {
            "cluster.yaml": cluster_yaml(),
            "models/good.yaml": _provider("good", engine, "{file: good-key}"),
            "models/other.yaml": _provider("other", engine, "{file: good-key}"),
            "tenants.yaml": _tenants(["good", "other"]),
        }
    )
    running, _ = await start(settings_for(tmp_path, repo.path))
    (tmp_path / "keys").write_text(f"{hash_key(KEY)} p1 key-1\n")
    router = start_router_proc(
        tmp_path / "router.log",
        [
            "--controller",
            running.url,
            "--token-file",
            str(tmp_path / "token"),
            "--keys-file",
            str(tmp_path / "keys"),
            "--secrets-dir",
            str(router_secrets),
            "--state-dir",
            str(tmp_path / "router-state"),
        ],
    )
    client = openai.OpenAI(base_url=router.api + "/v1", api_key=KEY, max_retries=0, timeout=30)
    try:
        await wait_for(lambda: _is(client, "good", 200), 30, "p1 served `good` by the first revision")
        # The next revision takes `good` away from p1 and adds a provider whose key file the router lacks
        # (valid in the repo: the name is confined; the file is simply not there).
        repo.write(
            {
                "models/broken.yaml": _provider("broken", engine, "{file: missing-key}"),
                "tenants.yaml": _tenants(["other", "broken"]),
            }
        )
        await wait_for(lambda: _is(client, "good", 403), 30, "the new allowlist applied by the router")
        assert await _status(client, "other") == 200  # the rest of the revision is served
        assert await _status(client, "broken") == 503  # the one provider without a key is unavailable
        text = _metrics(router.metrics)
        assert 'llmgw_router_provider_unavailable{model="broken"} 1.0' in text, text
        log = router.text()
        lines = [line for line in log.splitlines() if "model broken: provider dropped" in line]
        assert len(lines) == 1 and "ERROR" in lines[0] and "missing-key" in lines[0], log[-3000:]
        # The key arrives: the provider is back on the next snapshot, the gauge series is gone.
        (router_secrets / "missing-key").write_text("now-there\n")
        repo.write({"models/broken.yaml": _provider("broken", engine, "{file: missing-key}", 4096)})
        await wait_for(lambda: _is(client, "broken", 200), 30, "broken back once its key is there")
        assert 'llmgw_router_provider_unavailable{model="broken"}' not in _metrics(router.metrics)
    finally:
        router.stop()
        await running.stop()
        engine.stop()
