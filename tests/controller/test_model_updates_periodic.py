"""The controller's periodic check against the origin (the Cluster's `mirror.check_every`): a real controller
asks a local HTTP origin whose files change (tests/hf_origin.py), keeps the answer for `GET /api/v1/weights/updates`
and records the news as one `weights_update` event; `llmgw model updates --last` shows that answer without
asking the origin (it answers while the origin is down). `off` stops the checks. The decisions (when a check is
due, what is news) are pure and tested here too."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.cluster import Cluster
from hf_origin import Origin, files_of, running_origin
from pydantic import ValidationError
from support import wait_for

from controller.fleet_ops import cli
from controller.helpers import cluster_yaml, status_if_applied
from controller.test_webhook import Receiver, notification_yaml, receiver  # noqa: F401  (the fixture)
from llmgw.core.config.specs.cluster_spec import MirrorSettings
from llmgw.core.plan.update_checks import check_interval, news, next_check_at
from llmgw.core.plan.weight_updates import Update
from llmgw.core.weights.manifest import manifest_json

C1, C2 = "1" * 7 + "a" * 33, "2" * 7 + "b" * 33
OLD = {"config.json": b"{}", "model.gguf": b"old weights" * 100}
NEW = {"config.json": b"{}", "model.gguf": b"new weights" * 120}
MODEL = f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: small}}
spec:
  context_length: 4096
  source: {{repo: org/small, revision: '{C1[:7]}', manifest: manifests/small.json}}
  scaling: {{min: 0, max: 1, idle_timeout: 10m}}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1}}
"""


def test_a_check_is_due_an_interval_after_the_last_or_after_leading_began_and_never_when_off() -> None:
    assert check_interval("off") is None and check_interval("90m") == 5400
    assert next_check_at(None, 100.0, 60.0) == 160.0  # the first waits an interval too
    assert next_check_at(500.0, 100.0, 60.0) == 560.0
    assert next_check_at(500.0, 100.0, None) is None
    assert MirrorSettings().check_every == "24h"
    for bad, words in (("0s", "longer than zero"), ("never", "should match pattern")):
        with pytest.raises(ValidationError, match=words):
            MirrorSettings(check_every=bad)


def test_news_is_what_differs_from_the_answer_before() -> None:
    current = Update("m", "org/m@1111111", "current", "2 file(s)")
    changed = Update("m", "org/m@1111111", "changed", "a changed upstream at 2222222", "2222222", (), ("a",))
    unchecked = Update("m", "org/m@1111111", "not checked", "no answer")
    assert news({}, [current]) == []  # first seen current: nothing to say
    assert news({}, [changed]) == [changed] and news({}, [unchecked]) == [unchecked]
    assert news({"m": current}, [changed]) == [changed]
    assert news({"m": changed}, [changed]) == []  # still pending: said once
    moved_again = Update(
        "m", "org/m@1111111", "changed", "a changed upstream at 3333333", "3333333", (), ("a",)
    )
    assert news({"m": changed}, [moved_again]) == [moved_again]
    assert news({"m": changed}, [unchecked]) == [unchecked]  # the origin stopped answering: never silent
    nothing_to_ask = Update("p", "a path on the node", "not checked", "nothing upstream to ask", asked=False)
    assert news({}, [nothing_to_ask]) == [] and news({"p": current}, [nothing_to_ask]) == [nothing_to_ask]


@pytest.fixture
def origin() -> Iterator[Origin]:
    with running_origin() as o:
        yield o


def cluster_doc(origin: Origin, every: str) -> str:
    return cluster_yaml() + f"  mirror: {{origin: '{origin.url}', check_every: {every}}}\n"


@pytest.fixture
async def cluster(
    tmp_path: Path,
    origin: Origin,
    receiver: Receiver,  # noqa: F811
) -> AsyncIterator[Cluster]:
    origin.push(C1, OLD)
    c = Cluster(tmp_path)
    manifest = json.dumps(manifest_json(files_of(OLD)), indent=1) + "\n"
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "hook-secret").write_text("s")
    files = {
        "cluster.yaml": cluster_doc(origin, "1s"),
        "manifests/small.json": manifest,
        "models/small.yaml": MODEL,
        "hook.yaml": notification_yaml(receiver.url, name="weights", events="[weights_update]"),
    }
    revision = c.repo.write(files, "small, checked every second")
    try:
        admin = await c.start_controller()
        await wait_for(lambda: status_if_applied(admin, revision), 30, "the first revision applied")
        yield c
    finally:
        await c.close()


async def last_check(cluster: Cluster) -> dict[str, Any]:
    assert cluster.admin is not None
    answer: dict[str, Any] = await cluster.admin.get("/api/v1/weights/updates")
    return answer


async def small_is(cluster: Cluster, state: str) -> dict[str, Any] | None:
    answer = await last_check(cluster)
    rows = {u["model"]: u for u in answer["updates"]}
    return answer if "small" in rows and rows["small"]["state"] == state else None


async def test_the_controller_checks_on_schedule_says_the_news_once_and_the_cli_reads_its_last_answer(
    cluster: Cluster,
    origin: Origin,
    receiver: Receiver,  # noqa: F811
) -> None:
    quiet = await wait_for(lambda: small_is(cluster, "current"), 30, "a check finding small current")
    assert quiet["check_every"] == "1s" and quiet["checked_at"] is not None and quiet["next_at"] is not None
    assert [e for e in await cluster.events() if e["kind"] == "weights_update"] == []

    origin.push(C2, NEW)
    found = await wait_for(lambda: small_is(cluster, "changed"), 30, "a check finding small changed")
    [small] = found["updates"]
    assert small["revision"] == C2 and small["changed"] == ["model.gguf"]
    assert {f["sha256"] for f in small["files"]} == {f.sha256 for f in files_of(NEW)}
    # Two more checks: the pending update is still one event.
    after = found["checked_at"]
    for _ in range(2):
        after = await wait_for(lambda t=after: checked_after(cluster, t), 30, "one more check")
    said = [e for e in await cluster.events() if e["kind"] == "weights_update"]
    assert [(e["object"], "model.gguf changed upstream at" in e["message"]) for e in said] == [
        ("small", True)
    ]
    assert "llmgw model update small" in said[0]["message"]
    # A Notification on weights_update: the same news, once, to the webhook.
    await wait_for(lambda: receiver.delivered(), 30, "the update delivered")
    [(headers, body)] = receiver.delivered()
    sent = json.loads(body)
    assert (headers["X-Llmgw-Event"], sent["object"], sent["fields"]["model"]) == ("weights_update",) + (
        "small",
    ) * 2
    assert sent["message"] == said[0]["message"]

    # Off: the next revision stops the checks; the last answer stays, and the CLI reads it with the origin down.
    off = cluster.repo.write({"cluster.yaml": cluster_doc(origin, "off")}, "checks off")
    admin = cluster.admin
    assert admin is not None
    await wait_for(lambda: status_if_applied(admin, off), 30, "checks turned off")
    stopped = await last_check(cluster)
    assert (stopped["check_every"], stopped["next_at"]) == ("off", None), stopped
    origin.stop()
    code, out = await asyncio.to_thread(cli, cluster, "model", "updates", "--last", "--json")
    assert code == 0, out
    shown = json.loads(out)
    assert shown["checked_at"] == stopped["checked_at"] and shown["updates"][0]["state"] == "changed", shown
    code, out = await asyncio.to_thread(cli, cluster, "model", "updates", "--last")
    assert code == 0 and "mirror.check_every: off" in out and "changed" in out, out


async def checked_after(cluster: Cluster, after: float) -> float | None:
    checked: float | None = (await last_check(cluster))["checked_at"]
    return checked if checked is not None and checked > after else None
