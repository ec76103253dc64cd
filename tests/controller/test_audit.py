"""The audit log: every admin action that changes something, with its actor and outcome, append-only, never a
secret, written even when the store was down at the time. A real controller on SQLite and PostgreSQL."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support import wait_for
from typer.testing import CliRunner

from llmgw.adapters.repo_files import content_hash
from llmgw.cli.main import app as cli_app
from llmgw.store import Store
from llmgw.store.migrate import load_migrations

from .helpers import Repo, cluster_yaml, model_yaml, settings_for, start, status_if_applied

APPLY_TOKEN = "apply-token-for-ci"
BROKEN = model_yaml("sim-b").replace("context_length: 4096", "context_length: 4096\n  colour: blue")
PROJECT = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: web}
spec: {organization: acme}
"""


def _tokens(tmp: Path) -> Path:
    (tmp / "apply-token").write_text(APPLY_TOKEN)
    tokens = tmp / "admin-tokens.yaml"
    tokens.write_text("ci-apply: {scope: apply, file: apply-token}\n")
    return tokens


async def _post(url: str, token: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    hdrs = {"Authorization": f"Bearer {token}", **(headers or {})}
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=hdrs) as r:
        return r.status, await r.json()


def _files(repo: Path) -> dict[str, str]:
    return {str(p.relative_to(repo)): p.read_text() for p in sorted(repo.rglob("*.yaml"))}


async def test_apply_and_key_revoke_appear_with_their_actor_and_no_secret(
    tmp_path: Path, controller_dsn: str
) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write(
        {"cluster.yaml": cluster_yaml(), "tenants.yaml": PROJECT, "m.yaml": model_yaml("sim-a", min_=0)}
    )
    settings = settings_for(tmp_path, repo.path, store=controller_dsn, admin_tokens_file=_tokens(tmp_path))
    running, admin = await start(settings)
    try:
        await wait_for(lambda: status_if_applied(admin, content_hash(repo.path)), what="the repo applied")
        url = running.url
        files = _files(repo.path) | {"b.yaml": model_yaml("sim-b", min_=0)}
        status, body = await _post(url + "/api/v1/apply", APPLY_TOKEN, {"files": files, "actor": "gh-run:9"})
        assert status == 200, body
        applied = body["revision"]
        status, _ = await _post(url + "/api/v1/apply", APPLY_TOKEN, {"files": files | {"b.yaml": BROKEN}})
        assert status == 422
        status, _ = await _post(url + "/api/v1/keys", APPLY_TOKEN, {"project": "web"})
        assert status == 403  # ci-apply may apply, not make keys: refused, and audited as such
        created = await admin.post("/api/v1/keys", {"project": "web", "name": "k"}, expect=201)
        plaintext, key_id = created["key"], created["id"]
        status, _ = await _post(
            url + f"/api/v1/keys/{key_id}/revoke",
            running.admin_token,
            None,
            {"X-Llmgw-Actor": "alice@laptop"},
        )
        assert status == 200
        await admin.get("/api/v1/keys")  # a read: not audited

        async def five() -> Any:
            entries = (await admin.get("/api/v1/audit"))["entries"]
            return entries if len(entries) >= 5 else None

        entries = list(reversed(await wait_for(five, what="five audit entries")))  # oldest first
        seen = [(e["actor"], e["action"], e["object"], e["outcome"]) for e in entries]
        assert seen == [
            ("ci-apply", "apply", applied, "accepted"),
            ("ci-apply", "apply", seen[1][2], "refused"),
            ("ci-apply", "key.create", "", "refused"),
            ("admin", "key.create", f"{key_id} (project web)", "accepted"),
            ("admin", "key.revoke", key_id, "accepted"),
        ]
        assert entries[0]["actor_detail"] == "gh-run:9" and entries[4]["actor_detail"] == "alice@laptop"
        assert "colour" in entries[1]["reason"] and entries[1]["reason"].startswith("422")
        assert "scope" in entries[2]["reason"] and entries[2]["reason"].startswith("403")
        since_actor = await admin.get("/api/v1/audit?actor=admin")
        assert [e["action"] for e in since_actor["entries"]] == ["key.revoke", "key.create"]

        # No secret anywhere in the log: not the key, not a token (the raw rows, every column).
        async with running.controller.store.db.tx() as tx:
            rows = await tx.fetch("SELECT * FROM audit_log")
        dumped = json.dumps([list(r) for r in rows], default=str)
        for secret in (plaintext, plaintext[len("sk-llmgw-") :], APPLY_TOKEN, running.admin_token):
            assert secret not in dumped
    finally:
        await running.stop()


async def test_llmgw_audit_reads_the_log_through_the_admin_api(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "m.yaml": model_yaml("sim-a", min_=0)})
    running, admin = await start(settings_for(tmp_path, repo.path, admin_tokens_file=_tokens(tmp_path)))
    try:
        await wait_for(lambda: status_if_applied(admin, content_hash(repo.path)), what="the repo applied")
        status, _ = await _post(running.url + "/api/v1/apply", APPLY_TOKEN, {"files": _files(repo.path)})
        assert status == 200
        await wait_for(lambda: running.controller.store.list_audit(), what="the apply audited")
        env = {"LLMGW_TOKEN": "test-token"}
        base = ["audit", "--controller", running.url]
        # CliRunner runs the command in this thread; its own event loop would clash with the test's.
        import asyncio

        def run(args: list[str]) -> Any:
            return CliRunner().invoke(cli_app, base + args, env=env)

        result = await asyncio.to_thread(run, ["--json", "--since", "1d"])
        assert result.exit_code == 0, result.output
        entries = json.loads(result.output)
        assert [(e["actor"], e["action"], e["outcome"]) for e in entries] == [
            ("ci-apply", "apply", "accepted")
        ]
        result = await asyncio.to_thread(run, ["--actor", "nobody", "--json"])
        assert result.exit_code == 0 and json.loads(result.output) == []
        result = await asyncio.to_thread(run, [])
        assert result.exit_code == 0 and "ci-apply" in result.output and "apply" in result.output
        result = await asyncio.to_thread(run, ["--since", "yesterday"])
        assert result.exit_code != 0 and "--since" in result.output
    finally:
        await running.stop()


def test_the_audit_log_has_no_update_or_delete_path() -> None:
    """Append-only by construction: no store method and no statement of llmgw changes or removes a row."""
    methods = [name for name, _ in inspect.getmembers(Store, inspect.isfunction) if "audit" in name]
    assert sorted(methods) == ["list_audit", "record_audit"]
    store_dir = Path(inspect.getfile(Store)).parent
    sources = [p.read_text() for p in store_dir.glob("*.py")]
    changes = re.compile(r"(UPDATE\s+audit_log|DELETE\s+FROM\s+audit_log|DROP\s+TABLE\s+audit_log)", re.I)
    assert not any(changes.search(text) for text in sources)
    statements = [s for m in load_migrations() for s in m.statements]
    assert not any(changes.search(s) for s in statements)


async def test_a_retried_audit_entry_is_written_once(controller_dsn: str) -> None:
    from llmgw.store.records import AuditEntry

    store = await Store.open(controller_dsn)
    try:
        entry = AuditEntry(10.0, "admin", "key.revoke", "key_1", "accepted")
        await store.record_audit(entry)
        await store.record_audit(entry)
        assert await store.list_audit() == [entry]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_an_audit_entry_made_while_the_store_is_down_is_written_when_it_is_back(
    tmp_path: Path, pg_server: Any
) -> None:
    """The store stops; an admin apply still takes effect at once, and its audit entry lands later."""
    if not pg_server.controllable:
        pytest.fail("this test stops and starts the PostgreSQL server: it needs the one the fixture runs")
    dsn = pg_server.create_database()
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "m.yaml": model_yaml("sim-a", min_=0)})
    running, admin = await start(
        settings_for(tmp_path, repo.path, store=dsn, admin_tokens_file=_tokens(tmp_path))
    )
    c = running.controller
    try:
        await wait_for(lambda: status_if_applied(admin, content_hash(repo.path)), what="the repo applied")
        files = _files(repo.path) | {"b.yaml": model_yaml("sim-b", min_=0)}
        pg_server.stop()
        try:
            status, body = await _post(running.url + "/api/v1/apply", APPLY_TOKEN, {"files": files})
            assert status == 200, body
            await wait_for(
                lambda: c.audit.write_error, what="the audit write failing while the store is down"
            )
            assert [e.action for e in c.audit.pending] == ["apply"]
        finally:
            pg_server.start()

        async def written() -> Any:
            return not c.audit.pending and [e.actor for e in await c.store.list_audit()] == ["ci-apply"]

        await wait_for(written, limit_s=60, what="the queued audit entry written once the store is back")
    finally:
        await running.stop()
        pg_server.drop_database(dsn)


def test_key_commands_on_the_store_directly_are_audited_as_the_local_user(tmp_path: Path) -> None:
    import asyncio
    import getpass

    dsn = f"sqlite:///{tmp_path / 'direct.db'}"
    made = CliRunner().invoke(cli_app, ["keys", "create", "--project", "web", "--store", dsn, "--json"])
    assert made.exit_code == 0, made.output
    key = json.loads(made.output)
    assert CliRunner().invoke(cli_app, ["keys", "revoke", key["id"], "--store", dsn]).exit_code == 0
    assert CliRunner().invoke(cli_app, ["keys", "revoke", "key_nope", "--store", dsn]).exit_code != 0

    async def entries() -> list[Any]:
        store = await Store.open(dsn)
        try:
            async with store.db.tx() as tx:
                raw = json.dumps([list(r) for r in await tx.fetch("SELECT * FROM audit_log")], default=str)
            return [raw, *reversed(await store.list_audit())]
        finally:
            await store.close()

    raw, *found = asyncio.run(entries())
    actor = f"local:{getpass.getuser()}"
    assert [(e.actor, e.action, e.outcome, e.via) for e in found] == [
        (actor, "key.create", "accepted", "cli-store"),
        (actor, "key.revoke", "accepted", "cli-store"),
        (actor, "key.revoke", "refused", "cli-store"),
    ]
    assert found[0].object == f"{key['id']} (project web)" and found[2].reason == "no such key"
    assert key["key"] not in raw
