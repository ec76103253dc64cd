"""`/api/v1/credentials/*` takes a token with scope `admin`, as docs/controller.md says, and no less.

Found by the architecture review: the endpoints accepted only the controller's own admin token, while the docs'
scope table says `admin` may do everything and the credentials table marks them `(admin)`. The docs are what
operators were told, and a named admin token is what an operator holds (the audit log needs the name), so the
code now follows the docs: a named `admin` token gets the router's or a node's token, `plan` and `apply` get 403
naming the scope, an unknown token 401, and each issue is in the audit log with the token's name. Against a
real controller on loopback with its real store.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from controller.helpers import Repo, cluster_yaml, settings_for, start
from support import wait_for

OPERATOR_TOKEN = "alice-operator-admin-token"  # a named token with scope admin
APPLY_TOKEN = "ci-apply-token-for-main"
PLAN_TOKEN = "ci-plan-token-for-pull-requests"
OWN_TOKEN = "test-token"  # settings_for's --admin-token-file: the controller's own


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    tokens = tmp_path / "admin-tokens.yaml"
    tokens.write_text(
        f"alice: {{scope: admin, sha256: {_sha(OPERATOR_TOKEN)}}}\n"
        f"ci-apply: {{scope: apply, sha256: {_sha(APPLY_TOKEN)}}}\n"
        f"ci-plan: {{scope: plan, sha256: {_sha(PLAN_TOKEN)}}}\n"
    )
    running, _ = await start(settings_for(tmp_path, repo.path, admin_tokens_file=tokens))
    try:
        yield running, running.url
    finally:
        await running.stop()


async def _get(url: str, path: str, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as s, s.get(url + path, headers=headers) as r:
        return r.status, await r.json()


async def test_a_named_admin_token_gets_the_credentials_and_is_audited(controller: tuple[Any, str]) -> None:
    running, url = controller
    c = running.controller
    status, body = await _get(url, "/api/v1/credentials/router", OPERATOR_TOKEN)
    assert status == 200 and body["token"] == c.router_token()
    status, body = await _get(url, "/api/v1/credentials/node/n1", OPERATOR_TOKEN)
    assert status == 200 and body == {"node": "n1", "token": c.node_token("n1")}
    status, body = await _get(url, "/api/v1/credentials/router", OWN_TOKEN)  # the controller's own, as before
    assert status == 200 and body["token"] == c.router_token()

    async def issued() -> list[dict[str, Any]] | None:
        _, page = await _get(url, "/api/v1/audit?actor=alice", OWN_TOKEN)
        entries = [e for e in page["entries"] if e["action"].startswith("credential.")]
        return entries if len(entries) == 2 else None

    entries = await wait_for(issued, 10, "alice's two credential fetches in the audit log")
    assert {(e["action"], e["object"], e["outcome"]) for e in entries} == {
        ("credential.router", "", "accepted"),
        ("credential.node", "n1", "accepted"),
    }
    assert all(c.router_token() not in str(e) for e in entries)


@pytest.mark.parametrize("path", ["/api/v1/credentials/router", "/api/v1/credentials/node/n1"])
async def test_plan_and_apply_tokens_are_refused_with_the_scope_named(
    controller: tuple[Any, str], path: str
) -> None:
    _, url = controller
    for name, token, scope in (("ci-apply", APPLY_TOKEN, "apply"), ("ci-plan", PLAN_TOKEN, "plan")):
        status, body = await _get(url, path, token)
        assert status == 403, (name, body)
        message = body["error"]["message"]
        assert f"token '{name}' has scope {scope}" in message and "needs scope admin" in message
        assert "llmgw-rt-" not in str(body) and "llmgw-nt-" not in str(body)
    for token in ("not-a-token", None):
        status, body = await _get(url, path, token)
        assert status == 401 and "token" not in body
