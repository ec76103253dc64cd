"""The commit path as one trace, exported over OTLP/HTTP to a receiver on loopback: a revision, its
validation, the reconcile pass it causes, the start command to a real agent and the replica ready."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import free_port, wait_for

from llmgw.adapters.repo_files import content_hash

from .helpers import Admin, Agents, Repo, cluster_yaml, model_yaml, settings_for, start, status_if_applied

pytest.importorskip("opentelemetry.sdk", reason="the llmgw[tracing] extra is not installed")

from router.otlp_receiver import Receiver

pytestmark = pytest.mark.integration


async def test_a_commit_is_one_trace_from_revision_to_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export every 0.1 s rather than every 5
    receiver = await Receiver().start()
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(unreachable="10s", lost="60s")})
    port = free_port()
    settings = settings_for(tmp_path, repo.path, listen=f"127.0.0.1:{port}", otlp_endpoint=receiver.endpoint)
    agents = Agents(tmp_path, tmp_path / "token")
    running, admin = await start(settings)
    try:
        agents.start("n1", f"127.0.0.1:{port}")
        await wait_for(lambda: _node_ready(admin), 30, "node n1 Ready")
        repo.write({"models/a.yaml": model_yaml("sim-a", min_=1)})
        revision = content_hash(repo.path)
        await wait_for(lambda: status_if_applied(admin, revision), what="the model's revision applied")

        async def ready() -> bool:
            return [r["state"] for r in await admin.replicas("sim-a")] == ["ready"]

        await wait_for(ready, 60, "a ready replica of sim-a")
        await wait_for(lambda: "ready" in receiver.names(), 30, "the ready span exported")
    finally:
        await running.stop()
        agents.cleanup()
        await receiver.stop()
    [root] = [
        s for s in receiver.spans if s.name == "revision" and s.attributes.get("llmgw.revision") == revision
    ]
    trace = {s.span_id: s for s in receiver.spans if s.trace_id == root.trace_id}
    assert root.parent == "" and root.service == "llmgw-controller"
    by_name = {s.name: s for s in trace.values()}
    assert by_name["validate"].parent == root.span_id
    assert by_name["reconcile"].parent == root.span_id
    start_span = by_name["start"]
    assert start_span.parent == by_name["reconcile"].span_id
    assert start_span.attributes["llmgw.model"] == "sim-a" and start_span.attributes["llmgw.nodes"] == ["n1"]
    assert by_name["ready"].parent == start_span.span_id
    assert by_name["ready"].attributes["llmgw.replica"] == start_span.attributes["llmgw.replica"]


async def _node_ready(admin: Admin) -> bool:
    return await admin.node_state("n1") == "Ready"
