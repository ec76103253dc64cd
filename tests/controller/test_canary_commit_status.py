"""A canary's progress and verdict, and each revision's apply, posted as commit statuses (GitHub's and
Gitea/Forgejo's `POST /repos/{owner}/{repo}/statuses/{sha}`) to a loopback forge that checks the path, the
token and the body; retried with backoff; a forge that refuses is an event and one warning, and the rollout
goes on."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import bring_up, sim_model
from llmgw.adapters.commit_status import CommitStatus, StatusPoster

pytestmark = pytest.mark.integration

TOKEN = "forge-token-123"
SHA = "0123456789abcdef0123456789abcdef01234567"
ROLLOUT = (
    "\n  rollout:\n    strategy: canary\n"
    "    canary: {weight: 50, duration: 1s, gates: {min_requests: 0, max_ttft_ratio: null}}"
)


@dataclass
class Forge:
    """A forge's status API on loopback: answers with the next status of `script` (the last from then on),
    keeps what each request sent, and refuses what a forge would (a wrong token, a body that is not a
    status)."""

    script: list[int] = field(default_factory=lambda: [201])
    got: list[dict[str, Any]] = field(default_factory=list)
    base: str = ""
    runner: web.AppRunner | None = None
    host: str = "127.0.0.1"  # where it listens (tests/hosts: the lab's address of the test process)

    async def handle(self, request: web.Request) -> web.Response:
        status = self.script[min(len(self.got), len(self.script) - 1)]
        body = await request.json()
        auth = request.headers.get("Authorization")
        if auth != f"token {TOKEN}":
            status, answer = 401, {"message": "Bad credentials"}
        elif body.get("state") not in ("pending", "success", "failure", "error") or not body.get("context"):
            status, answer = 422, {"message": "Validation Failed"}
        else:
            answer = {"state": body["state"]}
        self.got.append({"path": request.path, "auth": auth, "body": body, "answered": status})
        return web.json_response(answer, status=status)

    def posted(self) -> list[dict[str, Any]]:
        return [g for g in self.got if g["answered"] < 300]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/v1/repos/{owner}/{repo}/statuses/{sha}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, 0)
        await site.start()
        self.base = f"http://{self.host}:{self.runner.addresses[0][1]}/api/v1/repos/acme/cluster"


@pytest.fixture
async def forge() -> AsyncIterator[Forge]:
    f = Forge()
    await f.start()
    yield f
    assert f.runner is not None
    await f.runner.cleanup()


def _cluster(tmp: Path, forge: Forge, token: str = TOKEN) -> Cluster:
    (tmp / "forge-token").write_text(token + "\n")
    return Cluster(
        tmp,
        commit_status_url=forge.base,
        commit_status_token_file=tmp / "forge-token",
        commit_status_target_url="https://console.example/models/m",
    )


async def test_a_canary_posts_pending_then_its_verdict_on_the_commit_it_tried(
    tmp_path: Path, forge: Forge
) -> None:
    forge.script = [502, 201]  # the forge's first answer is a 502: retried
    cluster = _cluster(tmp_path, forge)
    try:
        await bring_up(cluster, ["n1"], {"models/m.yaml": sim_model("m", 1, extra=ROLLOUT)})
        await cluster.wait_ready("m", 1)
        changed = sim_model("m", 1, extra=ROLLOUT, args="decode_ms_per_token: 3")
        tried = cluster.repo.write({"models/m.yaml": changed}, "a new engine setting")

        def on(sha: str, context: str) -> list[str]:
            return [
                g["body"]["state"]
                for g in forge.posted()
                if g["path"].endswith(f"/statuses/{sha}") and g["body"]["context"] == context
            ]

        await wait_for(
            lambda: on(tried, "llmgw/canary/m") == ["pending", "success"] or None, 90, "the verdict"
        )
        # The apply is pending until the fleet runs the revision (the canary promoted, the roll done).
        await wait_for(
            lambda: on(tried, "llmgw/apply") == ["pending", "success"] or None, 60, "apply healthy"
        )
        first = forge.got[0]
        assert first["answered"] == 502 and forge.got[1]["body"] == first["body"]  # the same status again
        verdict = next(
            g for g in forge.posted() if g["body"]["state"] == "success" and "canary" in g["body"]["context"]
        )
        assert verdict["path"] == f"/api/v1/repos/acme/cluster/statuses/{tried}"
        assert verdict["auth"] == f"token {TOKEN}"
        body = verdict["body"]
        assert body["description"].startswith("canary promoted: canary promoted (")
        assert len(body["description"]) <= 140 and body["target_url"] == "https://console.example/models/m"
        assert set(body) == {"state", "context", "description", "target_url"}
        kinds = [e["kind"] for e in await cluster.events()]
        assert "commit_status_failed" not in kinds
    finally:
        await cluster.close()
        cluster.agents.cleanup()


async def test_a_forge_that_refuses_is_an_event_and_one_warning_and_the_canary_goes_on(
    tmp_path: Path, forge: Forge, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = _cluster(tmp_path, forge, token="a-revoked-token")
    caplog.set_level(logging.WARNING, logger="llmgw.controller.loops.commit_statuses")
    try:
        await bring_up(cluster, ["n1"], {"models/m.yaml": sim_model("m", 1, extra=ROLLOUT)})
        await cluster.wait_ready("m", 1)
        changed = sim_model("m", 1, extra=ROLLOUT, args="decode_ms_per_token: 3")
        cluster.repo.write({"models/m.yaml": changed}, "a new engine setting")

        async def promoted() -> list[dict[str, Any]] | None:
            events = await cluster.events()
            return events if any(e["kind"] == "canary_promoted" for e in events) else None

        events = await wait_for(promoted, 90, "the canary promoted though no status could be posted")
        failed = [e for e in events if e["kind"] == "commit_status_failed"]
        assert failed, [e["kind"] for e in events]
        assert any(e["object"] == "llmgw/canary/m" and "answered 401" in e["message"] for e in failed)
        assert forge.got and all(g["answered"] == 401 for g in forge.got)
        # A 401 is final: each status was tried once, not retried.
        assert len(forge.got) == len({(g["path"], json.dumps(g["body"])) for g in forge.got})
        warnings = [r for r in caplog.records if "could not be posted" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
    finally:
        await cluster.close()
        cluster.agents.cleanup()


async def test_the_poster_retries_what_may_pass_and_gives_up_with_words(forge: Forge) -> None:
    status = CommitStatus(SHA, "pending", "llmgw/canary/m", "x" * 300)
    forge.script = [503, 429, 201]
    poster = StatusPoster(forge.base, TOKEN, attempts=4, backoff_s=0.01)
    assert await poster.post(status) is None
    assert [g["answered"] for g in forge.got] == [503, 429, 201]
    assert len(forge.got[-1]["body"]["description"]) == 140 and "target_url" not in forge.got[-1]["body"]
    forge.got.clear()
    forge.script = [500]
    problem = await poster.post(status)
    assert problem is not None and "answered 500" in problem and len(forge.got) == 4
    gone = StatusPoster("http://127.0.0.1:9/api/v1/repos/a/b", TOKEN, attempts=2, backoff_s=0.01)
    words = await gone.post(status)
    assert words is not None and "could not be reached" in words
