"""With ha, only the leader writes revision history and events to the store: a standby follows the repo too,
and its "applied revision X" beside the leader's would mislead whoever reads `llmgw events` or the history.

Two controllers in this process on one store (SQLite and PostgreSQL), each following its own directory so the
standby sees a revision the leader never does: without the gate its rows would be in the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support import wait_for

from llmgw.adapters.repo_files import content_hash
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

BROKEN = model_yaml("sim-c", min_=0).replace("context_length: 4096", "context_length: 4096\n  colour: blue")


async def _role(admin: Admin, role: str) -> Any:
    status = await admin.get("/api/v1/status")
    return status if status["leadership"]["role"] == role else None


async def test_only_the_leader_records_revisions_and_events(tmp_path: Path, controller_dsn: str) -> None:
    repo_a = Repo(tmp_path / "repo-a", use_git=False)
    repo_a.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    repo_b = Repo(tmp_path / "repo-b", use_git=False)
    repo_b.write({"cluster.yaml": cluster_yaml(), "models/b.yaml": model_yaml("sim-b", min_=0)})
    rev_a, rev_b = content_hash(repo_a.path), content_hash(repo_b.path)

    def settings(name: str, repo: Repo) -> Any:
        return settings_for(
            tmp_path,
            repo.path,
            store=controller_dsn,
            state_dir=tmp_path / f"state-{name}",
            ha=True,
            lease_ttl_s=3.0,
            lease_renew_s=0.3,
            settle_s=0.0,
        )

    a, admin_a = await start(settings("a", repo_a))
    a_running, b = True, None
    try:
        await wait_for(lambda: _role(admin_a, "leader"), what="controller a to lead")
        await wait_for(lambda: status_if_applied(admin_a, rev_a), what="a to apply its revision")
        b, admin_b = await start(settings("b", repo_b))
        await wait_for(lambda: _role(admin_b, "standby"), what="controller b to stand by")
        await wait_for(
            lambda: status_if_applied(admin_b, rev_b), what="the standby to apply its revision locally"
        )
        repo_b.write({"models/c.yaml": BROKEN})
        bad_b = content_hash(repo_b.path)
        await wait_for(
            lambda: status_if_refused(admin_b, bad_b), what="the standby to refuse a broken revision"
        )
        # The leader writes: a new revision of its own is recorded while the standby's never are.
        repo_a.write({"models/a2.yaml": model_yaml("sim-a2", min_=0)})
        rev_a2 = content_hash(repo_a.path)
        await wait_for(lambda: status_if_applied(admin_a, rev_a2), what="a to apply its second revision")

        store = a.controller.store
        recorded = {r.sha: r.status for r in await store.list_revisions()}
        assert recorded == {rev_a: "accepted", rev_a2: "accepted"}, recorded
        objects = {(e.kind, e.object) for e in await store.recent_events(limit=1000)}
        assert {("revision_applied", short(rev_a)), ("revision_applied", short(rev_a2))} <= objects
        assert not {o for o in objects if o[1] in (short(rev_b), short(bad_b))}, objects
        # The standby still shows what it saw (in memory, and its own status), as before.
        local = {(e["kind"], e["object"]) for e in b.controller.events.items}
        assert ("revision_applied", short(rev_b)) in local and ("revision_refused", short(bad_b)) in local

        # Once b leads, the revision it serves (the last good one) goes into the history, from the take-over.
        await a.stop()
        a_running = False
        await wait_for(lambda: _role(admin_b, "leader"), what="controller b to lead after a stopped")

        async def recorded_b() -> Any:
            return {r.sha: r.status for r in await b.controller.store.list_revisions()}.get(rev_b)

        assert await wait_for(recorded_b, what="b's revision recorded once it leads") == "accepted"
        events = [e for e in await b.controller.store.recent_events(limit=1000) if e.object == short(rev_b)]
        assert [(e.kind, e.message.endswith("on taking over as leader")) for e in events] == [
            ("revision_applied", True)
        ]
        assert not any(e.object == short(bad_b) for e in await b.controller.store.recent_events(limit=1000))
    finally:
        if b is not None:
            await b.stop()
        if a_running:
            await a.stop()
