"""L11: a failed engine's output tail (which can hold what a client sent) reaches only admin-scope readers.

The exploit as the review sketches it: an engine prints a tenant's prompt, then fails. Before, its last 20 lines
went into the `replica_failed` event (read with a `plan` token: the pull-request job's, Prometheus' http_sd one)
and into the Notification body posted to a URL the repo chose, and `/api/v1/replicas` showed them to any
scope. A webhook receiver could also answer with an endless body that the controller read whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from controller.test_reconcile_loop import Loop, loop  # noqa: F401  (the fixture)
from support import answering, wait_for

from llmgw.adapters.egress import checked_connector
from llmgw.controller.api import admin
from llmgw.controller.api.audited import PRINCIPAL
from llmgw.controller.core import CONTROLLER
from llmgw.controller.loops.notifier import WEBHOOK_ANSWER_BYTES, Notifier
from llmgw.controller.parts.admin_tokens import AdminPrincipal
from llmgw.core.config.models import NotificationSpec
from llmgw.store.records import Delivery

pytestmark = pytest.mark.integration

PROMPT = "PROMPT-OF-TENANT-A: my account number is 4711"
HOOK = """\
apiVersion: llmgw/v1
kind: Notification
metadata: {name: oncall}
spec:
  url: http://127.0.0.1:9/hook
  events: [replica_failed]
"""


async def _replicas_as(loop: Loop, scope: str) -> list[dict[str, object]]:  # noqa: F811
    app = web.Application()
    app[CONTROLLER] = loop.c
    request = make_mocked_request("GET", "/api/v1/replicas", app=app)
    request[PRINCIPAL] = AdminPrincipal(f"a-{scope}-token", scope)  # type: ignore[arg-type]
    response = await admin.replicas(request)
    assert response.text is not None
    items: list[dict[str, object]] = json.loads(response.text)["replicas"]
    return items


async def test_l11_a_failed_engines_tail_reaches_admin_scope_only(loop: Loop) -> None:  # noqa: F811
    notifier = Notifier(loop.c)
    loop.c.event_hooks.append(notifier.controller_event)
    loop.apply({"hook.yaml": HOOK})
    loop.agents.register("n1")
    await loop.settle()
    [sent] = loop.agents.started()
    link = loop.agents.nodes["n1"]
    shard_id = f"{sent.replica_id}-0"
    lines = ["loading", f"request: {PROMPT}", "Traceback: CUDA error"]
    link.shards[shard_id] = link.shards[shard_id].model_copy(
        update={"state": "failed", "last_output_lines": lines, "message": "engine exited: code 1"}
    )

    [as_plan] = await _replicas_as(loop, "plan")
    [as_apply] = await _replicas_as(loop, "apply")
    [as_admin] = await _replicas_as(loop, "admin")
    assert as_plan["state"] == "failed"
    assert as_plan["last_output_lines"] is None and as_apply["last_output_lines"] is None
    assert as_admin["last_output_lines"] == lines

    await loop.settle()  # the failed replica is stopped: replica_failed, and its notification queued
    [failed] = [e for e in loop.c.events.items if e["kind"] == "replica_failed"]
    assert PROMPT not in failed["message"] and f"llmgw logs {sent.replica_id}" in failed["message"]
    stored = [e for e in await loop.c.store.recent_events() if e.kind == "replica_failed"]
    assert stored and all(PROMPT not in e.message for e in stored)

    async def queued() -> list[Delivery]:  # the outbox write runs in the background
        due = await loop.c.store.due_deliveries(loop.c.wall() + 3600)
        return [d for d in due if d.event == "replica_failed"]

    deliveries = await wait_for(queued, 10, "the replica_failed notification queued")
    assert all(PROMPT not in d.body and "CUDA error" not in d.body for d in deliveries)


@pytest.fixture
async def endless_receiver() -> AsyncIterator[tuple[str, list[int]]]:
    """A webhook receiver that answers 200 and then sends up to 100 MB; yields its URL and the bytes sent."""
    sent = [0]

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(status=200)
        await resp.prepare(request)
        try:
            while sent[0] < 100 * (1 << 20):
                await resp.write(b"y" * (1 << 20))
                sent[0] += 1 << 20
        except ConnectionError:
            pass
        return resp

    async with answering(handle) as url:
        yield url + "/hook", sent


async def test_l11_a_webhook_answer_is_read_only_to_a_bound(
    loop: Loop,  # noqa: F811
    endless_receiver: tuple[str, list[int]],
) -> None:
    url, sent = endless_receiver
    spec = NotificationSpec.model_validate({"url": url, "events": ["replica_failed"]})
    delivery = Delivery("oncall", "replica_failed", "r1", '{"event": "replica_failed"}', time.time(), 0.0)
    async with aiohttp.ClientSession(connector=checked_connector("a webhook")) as session:
        attempt = await Notifier(loop.c)._post(session, spec, delivery)
    assert attempt.status == 200
    assert sent[0] < 100 * (1 << 20), "the controller read the receiver's whole 100 MB answer"
    assert WEBHOOK_ANSWER_BYTES < 1 << 20
