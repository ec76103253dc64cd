"""Revisions: a valid one is applied, an invalid one refused while the last good one keeps serving."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fixtures.leftover_check import snapshot
from support import wait_for

from llmgw.adapters.repo_files import content_hash
from llmgw.adapters.sources import GitSource
from llmgw.core.words import short

from .helpers import (
    Admin,
    Repo,
    cluster_yaml,
    model_yaml,
    settings_for,
    start,
    status_if_applied,
    status_if_refused,
)

BROKEN = model_yaml("sim-b").replace("context_length: 4096", "context_length: 4096\n  colour: blue")


async def test_directory_revision_refused_then_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    running, admin = await start(settings_for(tmp_path, repo.path))
    try:
        good = content_hash(repo.path)
        status = await wait_for(lambda: status_if_applied(admin, good), what="the first revision applied")
        assert status["sync"] == "Synced"
        assert [m["model"] for m in status["models"]] == ["sim-a"]

        caplog.set_level(logging.WARNING, logger="llmgw.controller")
        repo.write({"models/b.yaml": BROKEN})
        bad = content_hash(repo.path)
        status = await wait_for(lambda: status_if_refused(admin, bad), what="the broken revision refused")
        assert status["applied"]["revision"] == good  # the last good revision keeps serving
        assert status["sync"] == "OutOfSync"
        assert any("models/b.yaml:" in e and "colour" in e for e in status["refused"]["errors"])
        assert "llmgw_controller_revision_refused 1.0" in await admin.metrics()
        # Several more polls of the same broken revision: still one warning, not one per poll.
        seen_at = status["seen"]["at"]
        await wait_for(
            lambda: _seen_after(admin, seen_at, polls=3), what="three more polls of the broken revision"
        )
        warnings = [r for r in caplog.records if "refused" in r.getMessage() and short(bad) in r.getMessage()]
        assert len(warnings) == 1

        repo.write({"models/b.yaml": model_yaml("sim-b", min_=0)})
        fixed = content_hash(repo.path)
        status = await wait_for(lambda: status_if_applied(admin, fixed), what="the fixed revision applied")
        assert status["refused"] is None
        assert sorted(m["model"] for m in status["models"]) == ["sim-a", "sim-b"]
        assert "llmgw_controller_revision_refused 0.0" in await admin.metrics()
        assert f'llmgw_controller_revision_applied_info{{revision="{fixed}"}} 1.0' in await admin.metrics()
    finally:
        await running.stop()


async def test_git_source_follows_the_branch_and_survives_an_unreachable_remote(
    tmp_path: Path, controller_dsn: str
) -> None:
    repo = Repo(tmp_path / "origin", use_git=True)
    first = repo.write(
        {"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)}, "first"
    )
    # poll_s: only the webhook makes it poll again
    settings = settings_for(tmp_path, repo.path, poll_s=3600.0, store=controller_dsn)
    running, admin = await start(settings)
    try:
        await wait_for(lambda: status_if_applied(admin, first), what="the first commit applied")
        second = repo.write({"models/b.yaml": model_yaml("sim-b", min_=0)}, "add sim-b")
        async with aiohttp.ClientSession() as s, s.post(running.url + "/api/v1/webhook") as r:
            assert r.status == 202
        status = await wait_for(
            lambda: status_if_applied(admin, second), what="the second commit applied after the webhook"
        )
        assert status["applied"]["source"].startswith("git ")

        bad = repo.write({"models/c.yaml": BROKEN.replace("sim-b", "sim-c")}, "broken")
        await admin.post("/api/v1/webhook")
        status = await wait_for(lambda: status_if_refused(admin, bad), what="the broken commit refused")
        assert status["applied"]["revision"] == second

        revisions = await running.controller.store.list_revisions()
        recorded = {r.sha: r.status for r in revisions}
        assert recorded[first] == "accepted" and recorded[second] == "accepted" and recorded[bad] == "refused"

        shutil.move(str(repo.path), str(tmp_path / "moved"))  # the remote is gone
        await admin.post("/api/v1/webhook")
        status = await wait_for(
            lambda: _status_where(admin, lambda s: s["source_error"]), what="the source error shown"
        )
        assert status["applied"]["revision"] == second
        assert "llmgw_controller_source_up 0.0" in await admin.metrics()
    finally:
        await running.stop()


async def test_admin_needs_the_token_and_apply_takes_files(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    running, admin = await start(settings_for(tmp_path, repo.path, dir_poll_s=3600.0))
    try:
        await wait_for(
            lambda: status_if_applied(admin, content_hash(repo.path)), what="the first revision applied"
        )
        async with aiohttp.ClientSession() as s:
            for path in ("/api/v1/status", "/api/v1/nodes", "/api/v1/state"):
                async with s.get(running.url + path) as r:
                    assert r.status == 401
            async with s.get(running.url + "/api/v1/status", headers={"Authorization": "Bearer nope"}) as r:
                assert r.status == 401

        files = {"cluster.yaml": cluster_yaml(), "m.yaml": model_yaml("sim-z", min_=0)}
        reply = await admin.post("/api/v1/apply", {"files": files}, expect=200)
        assert reply["result"] == "applied"
        status = await admin.get("/api/v1/status")
        assert [m["model"] for m in status["models"]] == ["sim-z"]

        files = {"cluster.yaml": cluster_yaml(), "m.yaml": BROKEN}
        reply = await admin.post("/api/v1/apply", {"files": files}, expect=422)
        assert reply["result"] == "refused" and any("colour" in e for e in reply["errors"])
        assert [m["model"] for m in (await admin.get("/api/v1/status"))["models"]] == ["sim-z"]
        await admin.post("/api/v1/apply", {"files": {"../escape.yaml": "x"}}, expect=400)
    finally:
        await running.stop()


async def test_apply_by_path_reads_only_the_controllers_own_repo_and_apply_paths(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    extra = Repo(tmp_path / "ci-checkouts", use_git=False)
    extra.write({"job-1/cluster.yaml": cluster_yaml(), "job-1/m.yaml": model_yaml("sim-x", min_=0)})
    outside = Repo(tmp_path / "elsewhere", use_git=False)
    outside.write({"cluster.yaml": cluster_yaml(), "m.yaml": model_yaml("sim-z", min_=0)})
    (extra.path / "escape").symlink_to(outside.path)  # inside by name, outside once resolved
    settings = settings_for(tmp_path, repo.path, dir_poll_s=3600.0, apply_paths=[extra.path])
    running, admin = await start(settings)
    try:
        await wait_for(
            lambda: status_if_applied(admin, content_hash(repo.path)), what="the first revision applied"
        )
        for path in ("/", str(outside.path), str(repo.path / ".." / "elsewhere"), str(extra.path / "escape")):
            reply = await admin.post("/api/v1/apply", {"path": path}, expect=400)
            message = reply["error"]["message"]
            assert "outside the directories this controller applies from" in message, message
            assert str(repo.path.resolve()) in message and str(extra.path.resolve()) in message
            assert reply["error"]["allowed"] == [str(repo.path.resolve()), str(extra.path.resolve())]
        assert [m["model"] for m in (await admin.get("/api/v1/status"))["models"]] == ["sim-a"]

        reply = await admin.post("/api/v1/apply", {"path": str(extra.path / "job-1")}, expect=200)
        assert reply["result"] == "applied"
        assert [m["model"] for m in (await admin.get("/api/v1/status"))["models"]] == ["sim-x"]
        reply = await admin.post("/api/v1/apply", {"path": str(repo.path)}, expect=200)
        assert reply["result"] == "applied"
        assert [m["model"] for m in (await admin.get("/api/v1/status"))["models"]] == ["sim-a"]
    finally:
        await running.stop()


async def _status_where(admin: Admin, predicate: Any) -> Any:
    status = await admin.get("/api/v1/status")
    return status if predicate(status) else None


async def _seen_after(admin: Admin, at: float, polls: int) -> bool:
    status = await admin.get("/api/v1/status")
    return bool(status["seen"]["at"] > at + polls * 0.2)


def _git_children() -> list[str]:
    """This process's children that run git (GitPython's persistent `cat-file`s), each as "PID COMMAND"."""
    mine = [p for p in snapshot(details=False) if p.ppid == os.getpid() and not p.zombie]
    return [f"{p.pid} {' '.join(p.cmdline)}" for p in mine if p.cmdline and p.cmdline[0].endswith("git")]


def _origin(origin: Path) -> Path:
    """A git repository with one commit, made with the git CLI: no GitPython object of the test's own."""
    who = ["-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(origin)], check=True)
    (origin / "cluster.yaml").write_text(cluster_yaml())
    subprocess.run(["git", "-C", str(origin), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(origin), *who, "commit", "-q", "-m", "first"], check=True)
    return origin


async def test_a_git_poll_and_a_verification_leave_no_git_process_running(tmp_path: Path) -> None:
    origin = _origin(tmp_path / "origin")
    source = GitSource(str(origin), "main", ".", tmp_path / "state", interval_s=1.0)
    # Without the collector, what is not closed stays open: each Repo the source opens must be closed by it
    # (a controller polls for months; the suite's leftover check saw them still running after the run).
    # Only what this test opens counts: a test before it on the same worker may have left its own running.
    before = set(_git_children())
    gc.disable()
    try:
        checkout = await source.poll()
        assert await source.content_hash_at(checkout.revision) == content_hash(checkout.root)
        assert await source.branch_tip() == checkout.revision
        assert set(_git_children()) - before == set()
    finally:
        gc.enable()


def test_the_test_repo_leaves_no_git_process_running_after_a_commit(tmp_path: Path) -> None:
    # The tests' own cluster repo (helpers.Repo) kept GitPython's `git cat-file` processes of every git repo
    # a test made running until the collector took it, into the tests after it on the same worker.
    before = set(_git_children())
    gc.disable()
    try:
        repo = Repo(tmp_path / "repo", use_git=True)
        first = repo.write({"cluster.yaml": cluster_yaml()}, "cluster")
        second = repo.write({"models/a.yaml": model_yaml("sim-a")}, "a model")
        assert repo.git is not None and repo.git.git.rev_parse("HEAD") == second != first
        assert set(_git_children()) - before == set()
    finally:
        gc.enable()
