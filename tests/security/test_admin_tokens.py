"""Admin tokens are named and scoped (issue 15, item 2): a `plan` token reads, an `apply` token also applies,
only `admin` makes keys; the history records the token's name. And `llmgw keys` goes through the controller.

Against a real controller on loopback (tests/controller/helpers.py) with its real store.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for, start
from support import wait_for
from typer.testing import CliRunner

from llmgw.adapters import keys
from llmgw.adapters.repo_files import content_hash
from llmgw.cli.main import app
from llmgw.controller.api import routes as admin_routes
from llmgw.controller.parts.admin_tokens import AdminTokenError, AdminTokens
from llmgw.store import Store

PLAN_TOKEN = "plan-token-for-pull-requests"
APPLY_TOKEN = "apply-token-for-main"
ADMIN_TOKEN = "test-token"  # settings_for's --admin-token-file
TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: playground}
spec: {organization: acme, models: [sim-a]}
"""


class Controller:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.repo = Repo(tmp / "repo", use_git=False)
        self.running: Any = None
        self.url = ""
        self.dsn = f"sqlite:///{tmp / 'controller.db'}"

    async def call(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession() as s,
            s.request(method, self.url + path, json=body, headers=headers) as r,
        ):
            return r.status, await r.json()


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    c = Controller(tmp_path)
    c.repo.write(
        {
            "cluster.yaml": cluster_yaml(),
            "models/a.yaml": model_yaml("sim-a", min_=0),
            "tenants.yaml": TENANTS,
        }
    )
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "ci-apply").write_text(APPLY_TOKEN + "\n")
    tokens_file = tmp_path / "admin-tokens.yaml"
    tokens_file.write_text(
        f"ci-plan: {{scope: plan, sha256: {hashlib.sha256(PLAN_TOKEN.encode()).hexdigest()}}}\n"
        "ci-apply: {scope: apply, file: tokens/ci-apply}\n"
    )
    c.running, _ = await start(settings_for(tmp_path, c.repo.path, admin_tokens_file=tokens_file))
    c.url = c.running.url
    try:
        # Until the repo's revision is loaded no project is known, and a key for any name is taken (seen on a
        # busy xdist worker): the tests ask about the applied revision.
        running = c.running.controller
        await wait_for(lambda: running.desired is not None, what="the repo's revision loaded")
        yield c
    finally:
        await c.running.stop()


def _files(repo: Path) -> dict[str, str]:
    return {str(p.relative_to(repo)): p.read_text() for p in sorted(repo.rglob("*.yaml"))}


async def test_plan_token_can_plan_but_not_apply_or_create_keys(controller: Controller) -> None:
    for path in ("/api/v1/status", "/api/v1/state", "/api/v1/models", "/api/v1/events"):
        status, _ = await controller.call("GET", path, PLAN_TOKEN)
        assert status == 200, path
    status, body = await controller.call(
        "POST", "/api/v1/apply", PLAN_TOKEN, {"files": _files(controller.repo.path)}
    )
    assert status == 403
    message = body["error"]["message"]
    assert "token 'ci-plan' has scope plan" in message and "needs scope apply" in message
    assert PLAN_TOKEN not in json.dumps(body)
    status, body = await controller.call("POST", "/api/v1/keys", PLAN_TOKEN, {"project": "playground"})
    assert status == 403 and "needs scope admin" in body["error"]["message"]
    status, _ = await controller.call("GET", "/api/v1/keys", PLAN_TOKEN)
    assert status == 403


async def test_apply_token_applies_but_cannot_create_keys(controller: Controller) -> None:
    status, body = await controller.call(
        "POST", "/api/v1/apply", APPLY_TOKEN, {"files": _files(controller.repo.path)}
    )
    assert status == 200, body
    status, body = await controller.call("POST", "/api/v1/keys", APPLY_TOKEN, {"project": "playground"})
    assert status == 403
    assert "token 'ci-apply' has scope apply" in body["error"]["message"]
    store = await Store.open(controller.dsn)
    try:
        assert await store.list_keys() == []
    finally:
        await store.close()


async def test_unknown_token_is_401_not_403(controller: Controller) -> None:
    status, body = await controller.call("GET", "/api/v1/status", "not-a-token")
    assert status == 401 and "admin token required" in body["error"]["message"]


async def test_admin_token_creates_lists_and_revokes_keys(controller: Controller) -> None:
    status, made = await controller.call(
        "POST", "/api/v1/keys", ADMIN_TOKEN, {"project": "playground", "name": "ci"}
    )
    assert status == 201, made
    store = await Store.open(controller.dsn)
    try:
        found = await keys.lookup(store, made["key"], now=made["created_at"] + 1)
        assert found is not None and found.project == "playground"
    finally:
        await store.close()
    status, listed = await controller.call("GET", "/api/v1/keys", ADMIN_TOKEN)
    assert [k["id"] for k in listed["keys"]] == [made["id"]] and made["key"] not in json.dumps(listed)
    status, body = await controller.call("POST", "/api/v1/keys", ADMIN_TOKEN, {"project": "nope"})
    assert status == 404 and "playground" in body["error"]["message"]
    status, _ = await controller.call("POST", f"/api/v1/keys/{made['id']}/revoke", ADMIN_TOKEN)
    assert status == 200


async def test_audit_actor_is_the_token_name(controller: Controller) -> None:
    controller.repo.write({"models/b.yaml": model_yaml("sim-b", min_=0)})
    body = {"files": _files(controller.repo.path), "actor": "github-run:4242"}
    status, reply = await controller.call("POST", "/api/v1/apply", APPLY_TOKEN, body)
    assert status == 200 and reply["actor"] == "ci-apply", reply
    expected = "apply:" + content_hash(controller.repo.path).split(":", 1)[1]
    assert reply["revision"] == expected

    async def recorded() -> Any:
        store = await Store.open(controller.dsn)
        try:
            return next((r for r in await store.list_revisions() if r.sha == expected), None)
        finally:
            await store.close()

    row = await wait_for(recorded, what="the apply in the revision history")
    assert (row.applied_by, row.actor_detail, row.status) == ("ci-apply", "github-run:4242", "accepted")
    _, events = await controller.call("GET", "/api/v1/events", PLAN_TOKEN)
    assert any("by ci-apply (github-run:4242)" in e["message"] for e in events["events"])


async def test_keys_cli_creates_through_the_admin_api(controller: Controller, tmp_path: Path) -> None:
    token_file = tmp_path / "token"  # settings_for's admin token
    runner = CliRunner(env={"COLUMNS": "200", "LLMGW_STORE": None, "LLMGW_CONTROLLER": None})

    async def invoke(*words: str) -> Any:  # in a thread: the controller serves on this event loop
        return await asyncio.to_thread(runner.invoke, app, list(words))

    args = ["--controller", controller.url, "--token-file", str(token_file)]
    result = await invoke("keys", "create", "--project", "playground", "--json", *args)
    assert result.exit_code == 0, result.output
    made = json.loads(result.stdout)
    store = await Store.open(controller.dsn)
    try:
        assert await keys.lookup(store, made["key"], now=1.0) is not None  # in the store routers read
    finally:
        await store.close()
    listed = json.loads((await invoke("keys", "list", "--json", *args)).stdout)
    assert [k["id"] for k in listed] == [made["id"]]
    assert (await invoke("keys", "revoke", made["id"], *args)).exit_code == 0
    # The plan token cannot: the CLI says why.
    plan_file = tmp_path / "plan-token"
    plan_file.write_text(PLAN_TOKEN)
    result = await invoke(
        "keys",
        "create",
        "--project",
        "playground",
        "--controller",
        controller.url,
        "--token-file",
        str(plan_file),
    )
    assert result.exit_code == 1 and "needs scope admin" in result.output


def test_keys_without_store_or_controller_is_an_error_not_a_new_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `llmgw keys create` without --store made .llmgw/state/llmgw.db here, which no router reads."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "token").write_text("whatever\n")
    runner = CliRunner(env={"COLUMNS": "200", "LLMGW_STORE": None, "LLMGW_CONTROLLER": None})
    # Port 9 on loopback: nothing listens there.
    result = runner.invoke(
        app,
        ["keys", "create", "--project", "p", "--controller", "http://127.0.0.1:9", "--token-file", "token"],
    )
    assert result.exit_code == 1
    assert "cannot reach the controller at http://127.0.0.1:9" in result.output
    assert "--store DSN opens a store directly" in result.output
    assert not (tmp_path / ".llmgw").exists()


def test_every_admin_endpoint_declares_its_scope() -> None:
    from aiohttp import web

    app_ = web.Application()
    admin_routes.add_routes(app_)
    served = {
        (r.method, r.resource.canonical)
        for r in app_.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    declared = {(r.endpoint.method, r.endpoint.path) for r in admin_routes.ROUTES}
    assert served == declared
    unscoped = {r.endpoint.path for r in admin_routes.ROUTES if r.endpoint.auth in ("router", "none")}
    # Only these authenticate otherwise: the webhook trusts nothing in its body, the other two take a router's
    # token (llmgw.controller.wire.publisher.token_ok).
    assert unscoped == {"/api/v1/webhook", "/api/v1/demand/{model}", "/api/v1/usage-seen"}
    scopes = {r.endpoint.path: r.endpoint.auth for r in admin_routes.ROUTES if r.endpoint.method == "POST"}
    assert scopes["/api/v1/apply"] == "apply" and scopes["/api/v1/keys"] == "admin"


def test_the_single_admin_token_keeps_working_as_admin(tmp_path: Path) -> None:
    tokens = AdminTokens.load("only-token", None)
    who = tokens.principal("only-token")
    assert who is not None and (who.name, who.scope) == ("admin", "admin")
    assert tokens.principal("other") is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ci: {scope: write, sha256: " + "a" * 64 + "}\n", "ci.scope"),
        ("ci: {scope: plan}\n", "exactly one of sha256"),
        ("ci: {scope: plan, sha256: abc}\n", "64 lowercase hex"),
        ("admin: {scope: plan, sha256: " + "a" * 64 + "}\n", "controller's own admin token"),
        ("Bad Name: {scope: plan, sha256: " + "a" * 64 + "}\n", "lowercase letters"),
        (
            "a: {scope: plan, sha256: " + "b" * 64 + "}\nb: {scope: admin, sha256: " + "b" * 64 + "}\n",
            "are the same token",
        ),
        ("ci: {scope: plan, file: missing}\n", "ci.file: cannot read"),
    ],
)
def test_a_wrong_tokens_file_names_the_token_and_the_rule(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "admin-tokens.yaml"
    path.write_text(text)
    with pytest.raises(AdminTokenError) as caught:
        AdminTokens.load("own", path)
    assert str(path) in str(caught.value) and says in str(caught.value)


@pytest.mark.parametrize("path", ["/api/v1/apply", "/api/v1/keys"])
async def test_m7_admin_api_answers_deeply_nested_json_with_400(controller: Controller, path: str) -> None:
    """The admin API reads bodies with the depth-safe loader: a 200,000-deep array is a 400, not a 500."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    deep = "[" * 200_000 + "]" * 200_000
    async with aiohttp.ClientSession() as s, s.post(controller.url + path, data=deep, headers=headers) as r:
        assert r.status == 400, await r.text()
        assert "JSON" in (await r.json())["error"]["message"]
