"""Fleet events as webhooks, with a real agent and a real sim engine: a crash loop is one replica_failed
message (not one per crash), and an agent gone silent is node_lost."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from support import free_port, wait_for

from .helpers import Agents, Repo, cluster_yaml, model_yaml, settings_for, start
from .test_webhook import Receiver, notification_yaml, receiver  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration


async def test_a_crash_loop_is_one_replica_failed_and_a_silent_agent_is_node_lost(
    tmp_path: Path,
    receiver: Receiver,  # noqa: F811
) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "hook-secret").write_text("s")
    repo = Repo(tmp_path / "repo", use_git=False)
    hook = notification_yaml(receiver.url, events="[replica_failed, node_lost]")
    repo.write({"cluster.yaml": cluster_yaml(unreachable="2s", lost="4s"), "hook.yaml": hook})
    port = free_port()
    running, admin = await start(settings_for(tmp_path, repo.path, listen=f"127.0.0.1:{port}"))
    agents = Agents(tmp_path, tmp_path / "token")
    try:
        agents.start("n1", f"127.0.0.1:{port}")
        await wait_for(lambda: _node_is(admin, "n1", "Ready"), 30, "n1 Ready")
        repo.write({"m.yaml": model_yaml("sim-a", min_=1)})
        killed: list[str] = []
        for _ in range(2):  # two crashes of the model in a row: one message

            async def ready_new() -> Any:
                items = [r for r in await admin.replicas("sim-a") if r["state"] == "ready"]
                return next((r for r in items if r["id"] not in killed and r["pid"]), None)

            replica = await wait_for(ready_new, 60, "a ready replica of sim-a")
            killed.append(replica["id"])
            os.kill(replica["pid"], signal.SIGKILL)
            victim = str(replica["id"])
            await wait_for(lambda v=victim: _event_seen(admin, "replica_failed", v), 60, "the failure seen")
        await wait_for(lambda: receiver.delivered(), what="replica_failed delivered")
        agents.stop("n1", signal.SIGKILL)
        await wait_for(lambda: len(receiver.delivered()) == 2, 60, "node_lost delivered")
        sent = [json.loads(b) for _, b in receiver.delivered()]
        assert [p["event"] for p in sent] == ["replica_failed", "node_lost"]
        assert sent[0]["fields"]["model"] == "sim-a" and sent[0]["object"] == killed[0]
        assert sent[1]["object"] == "n1" and sent[1]["fields"]["node"] == "n1"
    finally:
        await running.stop()
        agents.cleanup()


async def _node_is(admin: Any, node: str, state: str) -> bool:
    return bool(await admin.node_state(node) == state)


async def _event_seen(admin: Any, kind: str, obj: str) -> bool:
    events = (await admin.get("/api/v1/events"))["events"]
    return any(e["kind"] == kind and e["object"] == obj for e in events)
