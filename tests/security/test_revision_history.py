"""M10: revision history is append-only, names who applied each revision, cannot be written under a git SHA
the content did not come from, and does not lose a record while the store is down.

A real controller following a real git repository (tests/controller/helpers.py), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for, start, status_if_applied
from support import wait_for

from llmgw.adapters.repo_files import content_hash
from llmgw.store import Store
from llmgw.store.db import open_backend
from llmgw.store.migrate import load_migrations, migrate
from llmgw.store.records import Revision

APPLY_TOKEN = "apply-token-for-main"


class GitController:
    """A controller following `repo`'s main branch, with an `apply`-scope token named ci-apply."""

    def __init__(self, tmp: Path, dsn: str) -> None:
        self.tmp = tmp
        self.dsn = dsn
        self.repo = Repo(tmp / "repo", use_git=True)
        self.running: Any = None
        self.admin: Any = None

    async def start(self, **extra: Any) -> None:
        (self.tmp / "apply-token").write_text(APPLY_TOKEN)
        tokens = self.tmp / "admin-tokens.yaml"
        tokens.write_text("ci-apply: {scope: apply, file: apply-token}\n")
        settings = settings_for(self.tmp, self.repo.path, store=self.dsn, admin_tokens_file=tokens, **extra)
        self.running, self.admin = await start(settings)

    async def apply(self, files: dict[str, str], revision: str | None = None) -> tuple[int, dict[str, Any]]:
        body: dict[str, Any] = {"files": files, "actor": "github-run:77"}
        if revision is not None:
            body["revision"] = revision
        headers = {"Authorization": f"Bearer {APPLY_TOKEN}"}
        async with (
            aiohttp.ClientSession() as s,
            s.post(self.running.url + "/api/v1/apply", json=body, headers=headers) as r,
        ):
            return r.status, await r.json()

    async def history(self) -> list[tuple[str, str]]:
        """(revision, actor), oldest first."""
        rows = await self.running.controller.store.list_revisions(limit=100)
        return [(r.sha, r.applied_by) for r in sorted(rows, key=lambda r: r.applied_at)]

    def files(self) -> dict[str, str]:
        return {
            str(p.relative_to(self.repo.path)): p.read_text() for p in sorted(self.repo.path.rglob("*.yaml"))
        }


@pytest.fixture
async def git_controller(tmp_path: Path, store_dsn: str) -> AsyncIterator[GitController]:
    c = GitController(tmp_path, store_dsn)
    yield c
    if c.running is not None:
        await c.running.stop()


def _apply_label(files: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        body = files[name].encode()
        digest.update(f"{name}\0{len(body)}\0".encode())
        digest.update(body)
    return "apply:" + digest.hexdigest()


async def test_m10_spoofed_sha_label_is_refused(git_controller: GitController) -> None:
    c = git_controller
    head = c.repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    await c.start()
    await wait_for(lambda: status_if_applied(c.admin, head), what="the branch head applied")

    # Content that was never in git, under the head's SHA: before, this showed Synced.
    spoofed = c.files() | {"models/b.yaml": model_yaml("sim-b", min_=0)}
    status, body = await c.apply(spoofed, revision=head)
    assert status == 409, body
    assert f"not commit {head[:12]}" in body["error"]["message"]
    # A SHA the branch does not have at all.
    status, body = await c.apply(spoofed, revision="ab" * 20)
    assert status == 409 and "is not a commit of" in body["error"]["message"]
    applied = (await c.admin.get("/api/v1/status"))["applied"]["revision"]
    assert applied == head

    # Without a label it is applied, and says what it is.
    status, body = await c.apply(spoofed)
    assert (
        status == 200 and body["revision"] == _apply_label(spoofed) and body["revision"].startswith("apply:")
    )
    # Status shows the apply label, never the branch's SHA, for content the branch does not have.
    assert (await c.admin.get("/api/v1/status"))["applied"]["revision"] == _apply_label(spoofed)


async def test_m10_a_sha_label_is_kept_when_the_files_are_that_commit(git_controller: GitController) -> None:
    c = git_controller
    first = c.repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    await c.start(poll_s=3600.0)  # read once: the next commit arrives only by the apply below
    await wait_for(lambda: status_if_applied(c.admin, first), what="the first commit applied")
    second = c.repo.write({"models/b.yaml": model_yaml("sim-b", min_=0)}, "second")
    status, body = await c.apply(c.files(), revision=second)
    assert status == 200 and body["revision"] == second, body


async def test_a_poll_that_shows_a_tip_already_applied_does_not_undo_a_later_apply(
    git_controller: GitController,
) -> None:
    """CI applies the branch tip by SHA, then someone applies other files; the poll that comes after (the
    one `llmgw apply` asks for, or the timed one) sees that tip for the first time itself, but it is no news."""
    c = git_controller
    first = c.repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    await c.start(poll_s=3600.0)
    await wait_for(lambda: status_if_applied(c.admin, first), what="the first commit applied")
    second = c.repo.write({"models/b.yaml": model_yaml("sim-b", min_=0)}, "second")
    status, body = await c.apply(c.files(), revision=second)
    assert status == 200 and body["revision"] == second, body
    other = c.files() | {"models/c.yaml": model_yaml("sim-c", min_=0)}
    status, body = await c.apply(other)
    assert status == 200 and body["revision"] == _apply_label(other), body

    last_poll = (await c.admin.get("/api/v1/status"))["polled"]["at"]
    await c.admin.post("/api/v1/webhook", {}, expect=202)

    async def polled_again() -> dict[str, Any] | None:
        s: dict[str, Any] = await c.admin.get("/api/v1/status")
        return s if s["polled"]["at"] > last_poll else None

    status_body = await wait_for(polled_again, 30, "a poll of the source after the webhook")
    assert status_body["polled"]["revision"] == second
    assert status_body["applied"]["revision"] == _apply_label(other)


async def test_m10_rollback_a_b_a_keeps_three_rows_with_actors(git_controller: GitController) -> None:
    c = git_controller
    a = c.repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)}, "A")
    a_files = c.files()
    await c.start()
    await wait_for(lambda: status_if_applied(c.admin, a), what="A applied by the controller")
    b = c.repo.write({"models/b.yaml": model_yaml("sim-b", min_=0)}, "B")
    await wait_for(lambda: status_if_applied(c.admin, b), what="B applied by the controller")
    # Roll back to A through the admin API, under A's SHA: the branch has A with exactly these files.
    status, body = await c.apply(a_files, revision=a)
    assert status == 200 and body["revision"] == a, body

    async def three() -> Any:
        history = await c.history()
        return history if len(history) >= 3 else None

    history = await wait_for(three, what="three history rows")
    assert history == [(a, "controller"), (b, "controller"), (a, "ci-apply")]
    rows = await c.running.controller.store.list_revisions(limit=1)
    assert rows[0].actor_detail == "github-run:77"


async def test_m10_history_written_while_the_store_is_down_is_retried(tmp_path: Path, pg_server: Any) -> None:
    """The store (a PostgreSQL server of the test's own) stops; an admin apply still takes effect, and its
    history record lands once the server is back, instead of only a log line."""
    if not pg_server.controllable:
        pytest.fail("this test stops and starts the PostgreSQL server: it needs the one the fixture runs")
    dsn = pg_server.create_database()
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    (tmp_path / "apply-token").write_text(APPLY_TOKEN)
    (tmp_path / "admin-tokens.yaml").write_text("ci-apply: {scope: apply, file: apply-token}\n")
    running, admin = await start(
        settings_for(tmp_path, repo.path, store=dsn, admin_tokens_file=tmp_path / "admin-tokens.yaml")
    )
    controller = running.controller
    try:
        first = content_hash(repo.path)
        await wait_for(lambda: status_if_applied(admin, first), what="the directory applied")
        files = {str(p.relative_to(repo.path)): p.read_text() for p in sorted(repo.path.rglob("*.yaml"))}
        files["models/b.yaml"] = model_yaml("sim-b", min_=0)  # sent only, so the source itself has no news
        pg_server.stop()
        try:
            headers = {"Authorization": f"Bearer {APPLY_TOKEN}"}
            async with (
                aiohttp.ClientSession() as s,
                s.post(running.url + "/api/v1/apply", json={"files": files}, headers=headers) as r,
            ):
                assert r.status == 200, await r.text()
                label = (await r.json())["revision"]
            assert label in [p.sha for p in controller.history.pending]
            assert controller.history.write_error
        finally:
            pg_server.start()

        async def recorded() -> Any:
            return not controller.history.pending and any(
                r.sha == label and r.applied_by == "ci-apply" for r in await controller.store.list_revisions()
            )

        await wait_for(recorded, limit_s=60, what="the queued history record written after the store is back")
    finally:
        await running.stop()
        pg_server.drop_database(dsn)


async def test_m10_a_retried_record_is_written_once(store_dsn: str, tmp_path: Path) -> None:
    store = await Store.open(store_dsn)
    try:
        record = Revision("a" * 40, "git x@main", 10.0, "controller", "accepted")
        await store.record_revision(record)
        await store.record_revision(record)  # the retry of a write whose answer was lost
        again = Revision("a" * 40, "git x@main", 20.0, "ci-apply", "accepted")  # applied again: a new row
        await store.record_revision(again)
        rows = await store.list_revisions()
        assert [(r.sha, r.applied_by, r.applied_at) for r in rows] == [
            ("a" * 40, "ci-apply", 20.0),
            ("a" * 40, "controller", 10.0),
        ]
    finally:
        await store.close()


async def test_m10_the_old_one_row_per_sha_table_is_migrated_into_the_history(store_dsn: str) -> None:
    """A store written before migration 0002 keeps its revisions, as the first history rows."""
    db = open_backend(store_dsn)
    try:
        old = [m for m in load_migrations() if m.version == 1]
        await migrate(db, old)
        async with db.tx() as tx:
            await tx.execute(
                "INSERT INTO revisions (sha, source, applied_at, applied_by, status, errors) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                ("c" * 40, "git x@main", 5.0, "controller", "accepted", "[]"),
            )
        await migrate(db)
    finally:
        await db.close()
    store = await Store.open(store_dsn)
    try:
        [row] = await store.list_revisions()
        assert (row.sha, row.applied_by, row.applied_at, row.status) == (
            "c" * 40,
            "controller",
            5.0,
            "accepted",
        )
        assert "revisions" not in await store.row_counts()
    finally:
        await store.close()
