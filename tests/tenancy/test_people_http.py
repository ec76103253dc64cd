"""People through a real controller and two real routers following it (issue 44): the admin API's roles (a
viewer is refused a key, a maintainer makes one), personal keys served where their owner belongs and charged to
them, and leaving: a commit that takes a person out of a project refuses their key on every router as soon as
the router holds that revision, though the key itself sits in each router's key cache for ten minutes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from controller.helpers import Admin, Repo, cluster_yaml, settings_for, start, status_if_applied
from faults.procs import RouterProc, start_router_proc
from router.helpers import SimProcess, start_sim, wait_healthy_sync
from support import wait_for

from llmgw.adapters.repo_files import content_hash
from llmgw.store import Store

pytestmark = pytest.mark.integration

MODEL = "people-chat"
OPERATOR = "operator-token-for-people"

TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: evals}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: other}
spec: {organization: acme}
"""


def people(bob_in_evals: bool = True) -> str:
    bob = "[{project: evals}, {project: other}]" if bob_in_evals else "[{project: other}]"
    return f"""\
apiVersion: llmgw/v1
kind: Person
metadata: {{name: alice}}
spec: {{email: alice@example.com, memberships: [{{project: evals, role: maintainer}}]}}
---
apiVersion: llmgw/v1
kind: Person
metadata: {{name: bob}}
spec: {{email: bob@example.com, memberships: {bob}}}
---
apiVersion: llmgw/v1
kind: Person
metadata: {{name: vic}}
spec: {{email: vic@example.com, memberships: [{{organization: acme, role: viewer}}]}}
"""


def provider_model(sim: SimProcess) -> str:
    # A provider (the sim, which asks no key when given none) serves without agents or replicas.
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {MODEL}}}
spec:
  context_length: 4096
  provider: {{url: "http://127.0.0.1:{sim.port}/v1", model: {MODEL}}}
"""


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    engine = start_sim(MODEL, "")
    try:
        wait_healthy_sync([engine])
        yield engine
    finally:
        engine.kill()


async def _call(admin: Admin, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, admin.url + path, json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


async def _key(admin: Admin, token: str, body: dict[str, Any], expect: int) -> dict[str, Any]:
    status, answer = await _call(admin, "POST", "/api/v1/keys", token, body)
    assert status == expect, (body, status, answer)
    return dict(answer)


async def _ask(router: RouterProc, key: str, project: str | None = None) -> tuple[int, str]:
    """(status, error code or '') of one chat request through `router` with `key`."""
    headers = {"x-llmgw-project": project} if project else {}
    async with openai.AsyncOpenAI(base_url=router.base_url, api_key=key, max_retries=0, timeout=30) as client:
        try:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_headers=headers
            )
        except openai.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            return exc.status_code, str(body.get("code") or body.get("error", {}).get("code"))
    return 200, ""


async def _revision(router: RouterProc) -> str | None:
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    async with aiohttp.ClientSession() as s, s.get(router.api + "/ready", headers=headers) as r:
        return (await r.json()).get("revision") if r.status == 200 else None


async def test_roles_personal_keys_and_leaving_on_every_router(tmp_path: Path, sim: SimProcess) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write(
        {
            "cluster.yaml": cluster_yaml(),
            "tenants.yaml": TENANTS,
            "people.yaml": people(),
            "m.yaml": provider_model(sim),
        }
    )
    dsn = f"sqlite:///{tmp_path / 'controller.db'}"
    running, admin = await start(settings_for(tmp_path, repo.path, store=dsn))
    routers: list[RouterProc] = []
    try:
        first = content_hash(repo.path)
        await wait_for(lambda: status_if_applied(admin, first), what="the repo applied")
        root = running.admin_token
        # Made by an admin token: each person's own key, and the owner's membership checked at making.
        vic = (await _key(admin, root, {"owner": "vic"}, 201))["key"]
        alice = (await _key(admin, root, {"owner": "alice", "project": "evals"}, 201))["key"]
        await _key(
            admin, root, {"owner": "vic", "project": "evals"}, 409
        )  # a viewer's key there never answers
        await _key(admin, root, {"owner": "nobody"}, 404)

        # Roles, one table: a viewer is refused a key, a maintainer makes a project key, a member their own.
        refused = await _key(admin, vic, {"project": "evals"}, 403)
        assert "viewer" in refused["error"]["message"] and "maintainer" in refused["error"]["message"]
        await _key(admin, vic, {"owner": "vic", "project": "evals"}, 403)
        project_key = await _key(admin, alice, {"project": "evals", "name": "ci"}, 201)
        assert project_key["owner"] is None and project_key["project"] == "evals"
        await _key(admin, alice, {"owner": "bob", "project": "evals"}, 403)  # only their own
        await _key(admin, alice, {"project": "other"}, 403)  # no role in `other`
        bob_made = await _key(admin, root, {"owner": "bob", "project": "evals"}, 201)
        bob = bob_made["key"]
        own = await _key(admin, bob, {"owner": "bob"}, 201)  # a member makes their own key
        status, listed = await _call(admin, "GET", "/api/v1/keys", vic)
        assert status == 200  # a viewer of acme sees the keys of its projects, and their own
        seen = {(k["owner"], k["project"]) for k in listed["keys"]}
        assert seen == {("vic", None), ("alice", "evals"), (None, "evals"), ("bob", "evals")}, seen
        assert own["id"] not in {k["id"] for k in listed["keys"]}  # bob's key of no project is his alone
        status, _ = await _call(admin, "POST", f"/api/v1/keys/{bob_made['id']}/revoke", vic)
        assert status == 403  # revoking another's key is a maintainer's
        status, audit = await _call(admin, "GET", "/api/v1/audit?actor=person:vic", root)
        assert status == 200 and {e["outcome"] for e in audit["entries"]} == {"refused"}, audit

        # Two routers following the controller, each caching keys for ten minutes.
        token = tmp_path / "token"
        (tmp_path / "operator").write_text(OPERATOR)
        for name in ("r1", "r2"):
            args = [
                "--controller",
                running.url,
                "--token-file",
                str(token),
                "--store",
                dsn,
                "--router-id",
                name,
                "--key-cache-ttl",
                "600",
                "--operator-token-file",
                str(tmp_path / "operator"),
            ]
            routers.append(start_router_proc(tmp_path / f"{name}.log", args))
        for router in routers:
            await wait_for(lambda r=router: _revision(r), 30, f"{router.api} holds the revision")  # type: ignore[misc]
            assert await _ask(router, bob) == (200, "")  # his key's default project
            assert await _ask(router, bob, "other") == (200, "")  # a project he names
            assert await _ask(router, alice, "other") == (403, "not_a_member")
            assert await _ask(router, vic, "evals") == (403, "not_a_member")  # a viewer may not use models
            assert await _ask(router, vic) == (400, "project_required")
            assert await _ask(router, project_key["key"], "other") == (200, "")  # a project key's is its own

        # Bob leaves evals by a commit: refused at once wherever the revision is, his key still cached.
        repo.write({"people.yaml": people(bob_in_evals=False)})
        second = content_hash(repo.path)
        await wait_for(lambda: status_if_applied(admin, second), what="bob's leaving applied")
        for router in routers:
            await wait_for(lambda r=router: _is(r, second), 30, f"{router.api} holds bob's leaving")  # type: ignore[misc]
            assert await _ask(router, bob) == (403, "not_a_member")
            assert await _ask(router, bob, "other") == (200, "")  # still a member there
    finally:
        for router in routers:
            router.stop()
        await running.stop()

    # Usage records who spent it, and groups by person.
    store = await Store.open(dsn)
    try:
        by_person = {t.group: t for t in await store.usage_totals("person")}
    finally:
        await store.close()
    # Two answered on each router before he left, one after (the refused request never reached a project).
    assert (by_person["bob"].requests, by_person["bob"].errors) == (6, 0)
    assert by_person[""].requests == 2  # the project key's: nobody's own


async def _is(router: RouterProc, revision: str) -> bool:
    return await _revision(router) == revision
