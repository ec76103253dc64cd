"""Webhook notifications end to end: a real controller (SQLite and PostgreSQL) delivering to a loopback aiohttp
receiver. Signed; retried after 5xx; kept across a controller restart; dead-lettered; a budget threshold sent
once per window however often it is polled."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from support import wait_for

from llmgw.adapters.repo_files import content_hash, load_repo
from llmgw.core.api import notify
from llmgw.store import Store, UsageRecord

from .helpers import Admin, Repo, cluster_yaml, model_yaml, settings_for, start, status_if_applied

SECRET = "whsec-test-signing-secret"
BROKEN = model_yaml("sim-b").replace("context_length: 4096", "context_length: 4096\n  colour: blue")
TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: web}
spec:
  organization: acme
  limits: {budget: {amount: 1.0, period: 1d}}
"""


def notification_yaml(
    url: str,
    name: str = "oncall",
    fmt: str = "json",
    attempts: int = 5,
    events: str = "[revision_refused, budget_80, budget_100]",
) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Notification
metadata: {{name: {name}}}
spec:
  url: {url}
  secret: {{file: hook-secret}}
  events: {events}
  format: {fmt}
  retry: {{attempts: {attempts}, backoff: 50ms, max_backoff: 200ms, timeout: 5s}}
"""


@dataclass
class Receiver:
    """A webhook receiver on loopback: answers each request with the next status of `script` (the last one
    from then on) and keeps what it was sent."""

    script: list[int] = field(default_factory=lambda: [200])
    got: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)
    url: str = ""
    runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        status = self.script[min(len(self.got), len(self.script) - 1)]
        self.got.append((dict(request.headers), await request.read(), status))
        return web.Response(status=status, text="ok" if status < 300 else "no")

    def delivered(self) -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for h, b, status in self.got if 200 <= status < 300]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    await r.start()
    yield r
    assert r.runner is not None
    await r.runner.cleanup()


def _repo(tmp: Path, *docs: str) -> Repo:
    (tmp / "secrets").mkdir(parents=True, exist_ok=True)
    (tmp / "secrets" / "hook-secret").write_text(SECRET + "\n")
    repo = Repo(tmp / "repo", use_git=False)
    files = {"cluster.yaml": cluster_yaml(), "m.yaml": model_yaml("sim-a", min_=0), "tenants.yaml": TENANTS}
    files |= {f"notify-{i}.yaml": d for i, d in enumerate(docs)}
    repo.write(files)
    return repo


async def _refuse_one(admin: Admin, repo: Repo) -> str:
    files = {str(p.relative_to(repo.path)): p.read_text() for p in sorted(repo.path.rglob("*.yaml"))}
    reply = await admin.post("/api/v1/apply", {"files": files | {"b.yaml": BROKEN}}, expect=422)
    return str(reply["revision"])


async def _started(tmp: Path, repo: Repo, dsn: str, **extra: Any) -> tuple[Any, Admin]:
    running, admin = await start(settings_for(tmp, repo.path, store=dsn, **extra))
    await wait_for(lambda: status_if_applied(admin, content_hash(repo.path)), what="the repo applied")
    return running, admin


async def test_a_refused_revision_arrives_signed_in_both_formats(
    tmp_path: Path, controller_dsn: str, receiver: Receiver
) -> None:
    repo = _repo(tmp_path, notification_yaml(receiver.url), notification_yaml(receiver.url, "chat", "slack"))
    running, admin = await _started(tmp_path, repo, controller_dsn)
    try:
        label = await _refuse_one(admin, repo)
        await wait_for(lambda: len(receiver.delivered()) == 2, what="the refusal sent to both webhooks")
        by_event = {json.loads(b).get("event", "slack"): (h, b) for h, b in receiver.delivered()}
        headers, body = by_event["revision_refused"]
        assert headers[notify.EVENT_HEADER] == "revision_refused"
        assert notify.verify(
            SECRET.encode(),
            headers[notify.TIMESTAMP_HEADER],
            body,
            headers[notify.SIGNATURE_HEADER],
            time.time(),
            300,
        )
        assert not notify.verify(
            b"another secret",
            headers[notify.TIMESTAMP_HEADER],
            body,
            headers[notify.SIGNATURE_HEADER],
            time.time(),
            300,
        )
        assert not notify.verify(
            SECRET.encode(),
            headers[notify.TIMESTAMP_HEADER],
            body + b" ",
            headers[notify.SIGNATURE_HEADER],
            time.time(),
            300,
        )
        payload = json.loads(body)
        assert payload["fields"]["revision"] == label and any(
            "colour" in e for e in payload["fields"]["errors"]
        )
        assert payload["id"] == headers[notify.DELIVERY_HEADER] and payload["cluster"] == "test"
        slack_headers, slack_body = by_event["slack"]
        text = json.loads(slack_body)["text"]
        assert text.startswith("[test] revision refused: ") and "colour" in text
        assert notify.verify(
            SECRET.encode(),
            slack_headers[notify.TIMESTAMP_HEADER],
            slack_body,
            slack_headers[notify.SIGNATURE_HEADER],
            time.time(),
            300,
        )
        await wait_for(lambda: _outbox_empty(running.controller.store), what="the delivered rows deleted")
    finally:
        await running.stop()


async def test_after_500s_it_is_retried_and_arrives(tmp_path: Path, receiver: Receiver) -> None:
    receiver.script = [500, 503, 200]
    repo = _repo(tmp_path, notification_yaml(receiver.url))
    running, admin = await _started(tmp_path, repo, f"sqlite:///{tmp_path / 'c.db'}")
    try:
        await _refuse_one(admin, repo)
        await wait_for(lambda: receiver.delivered(), what="the delivery after two 5xx")
        assert [status for _, _, status in receiver.got] == [500, 503, 200]
        ids = {h[notify.DELIVERY_HEADER] for h, _, _ in receiver.got}
        assert len(ids) == 1 and len({b for _, b, _ in receiver.got}) == 1  # one delivery, tried three times
        # The receiver keeps a request before it answers: the controller counts the answer just after.
        delivered = 'llmgw_controller_notification_deliveries_total{outcome="delivered"} 1.0'
        metrics = await wait_for(lambda: _metrics_with(admin, delivered), what="the delivery counted")
        assert 'llmgw_controller_notification_deliveries_total{outcome="retried"} 2.0' in metrics
    finally:
        await running.stop()


async def test_an_undelivered_event_is_still_delivered_after_a_controller_restart(
    tmp_path: Path, controller_dsn: str, receiver: Receiver
) -> None:
    receiver.script = [503]
    repo = _repo(tmp_path, notification_yaml(receiver.url, attempts=100))
    running, admin = await _started(tmp_path, repo, controller_dsn)
    try:
        await _refuse_one(admin, repo)
        await wait_for(lambda: len(receiver.got) >= 2, what="the receiver failing the delivery twice")
        # The receiver keeps a request before it answers; the controller records the attempt after the
        # answer, so the store is what to wait on before the stop.
        await wait_for(
            lambda: _attempted(running.controller.store, 2), what="two failed attempts in the outbox"
        )
    finally:
        await running.stop()
    store = await Store.open(controller_dsn)
    try:
        [owed] = await store.list_deliveries(dead=False)
    finally:
        await store.close()
    assert owed.event == "revision_refused" and owed.attempts >= 2
    receiver.script = [200]
    receiver.got.clear()
    running, _ = await _started(tmp_path, repo, controller_dsn)
    try:
        await wait_for(lambda: receiver.delivered(), what="the owed delivery sent by the new controller")
        [(headers, _)] = receiver.delivered()
        assert headers[notify.DELIVERY_HEADER] == owed.id
        await wait_for(lambda: _outbox_empty(running.controller.store), what="the delivered row deleted")
    finally:
        await running.stop()


async def _metrics_with(admin: Admin, line: str) -> str | None:
    text = await admin.metrics()
    return text if line in text else None


async def _attempted(store: Store, attempts: int) -> bool:
    owed = await store.list_deliveries(dead=False)
    return len(owed) == 1 and owed[0].attempts >= attempts


async def _outbox_empty(store: Store) -> bool:
    return await store.delivery_counts() == (0, 0)


async def test_a_dead_letter_after_n_failures_and_at_once_on_a_final_4xx(
    tmp_path: Path, controller_dsn: str, receiver: Receiver
) -> None:
    receiver.script = [500]
    gone = Receiver(script=[410])
    await gone.start()
    repo = _repo(tmp_path, notification_yaml(receiver.url, attempts=3), notification_yaml(gone.url, "gone"))
    running, admin = await _started(tmp_path, repo, controller_dsn)
    try:
        await _refuse_one(admin, repo)

        async def two_dead() -> Any:
            body = await admin.get("/api/v1/notifications?dead=1")
            return body if len(body["deliveries"]) == 2 else None

        body = await wait_for(two_dead, what="both deliveries dead-lettered")
        dead = {d["notification"]: d for d in body["deliveries"]}
        assert set(dead) == {"oncall", "gone"}, body
        assert dead["oncall"]["attempts"] == 3 and "gave up after 3" in dead["oncall"]["last_error"]
        assert dead["gone"]["attempts"] == 1 and "HTTP 410" in dead["gone"]["last_error"]
        assert len(receiver.got) == 3 and len(gone.got) == 1
        assert await running.controller.store.due_deliveries(time.time() + 3600) == []  # never tried again
        assert (await admin.get("/api/v1/notifications?dead=0"))["deliveries"] == []

        async def gauged() -> bool:
            return 'llmgw_controller_notifications_outbox{state="dead"} 2.0' in await admin.metrics()

        await wait_for(gauged, what="the dead letters in the outbox gauge")
        assert 'llmgw_controller_notification_deliveries_total{outcome="dead"} 2.0' in await admin.metrics()
    finally:
        await running.stop()
        assert gone.runner is not None
        await gone.runner.cleanup()


async def test_budget_80_fires_once_per_window_not_every_poll(
    tmp_path: Path, controller_dsn: str, receiver: Receiver
) -> None:
    repo = _repo(tmp_path, notification_yaml(receiver.url))
    running, _ = await _started(tmp_path, repo, controller_dsn, budget_check_s=0.05)
    c = running.controller
    notifier = running.notifier
    try:
        now = time.time()
        await c.store.insert_usage([UsageRecord(now, "req-1", "web", "sim-a", 200, org="acme", cost=0.85)])
        await wait_for(lambda: receiver.delivered(), what="budget_80 delivered")
        checked = notifier.budget_checks
        await wait_for(lambda: notifier.budget_checks >= checked + 5, what="five more budget checks")
        events = [json.loads(b)["event"] for _, b in receiver.delivered()]
        assert events == ["budget_80"]
        [(_, body)] = receiver.delivered()
        fields = json.loads(body)["fields"]
        assert (fields["tenant"], fields["level"], fields["percent"]) == ("web", "project", 80)

        await c.store.insert_usage([UsageRecord(now, "req-2", "web", "sim-a", 200, org="acme", cost=0.2)])
        await wait_for(lambda: len(receiver.delivered()) == 2, what="budget_100 delivered")
        checked = notifier.budget_checks
        await wait_for(lambda: notifier.budget_checks >= checked + 5, what="five more budget checks")
        assert [json.loads(b)["event"] for _, b in receiver.delivered()] == ["budget_80", "budget_100"]
    finally:
        await running.stop()
    # A restart does not say it again: the marks are in the store.
    receiver.got.clear()
    running, _ = await _started(tmp_path, repo, controller_dsn, budget_check_s=0.05)
    notifier = running.notifier
    try:
        await wait_for(lambda: notifier.budget_checks >= 3, what="three budget checks after the restart")
        assert receiver.got == []
    finally:
        await running.stop()


def test_a_webhook_to_a_metadata_or_link_local_address_is_refused_at_review(tmp_path: Path) -> None:
    for url, why in (  # `why` is a word of the error, and the directory name
        ("http://169.254.169.254/latest", "metadata"),
        ("http://[fe80::1]/hook", "link-local"),
        ("ftp://example.com/hook", "http"),
    ):
        repo = _repo(tmp_path / why, notification_yaml(url))
        result = load_repo(repo.path)
        assert result.repo is None
        assert any("spec.url" in str(e) and why in str(e) for e in result.errors), result.errors
