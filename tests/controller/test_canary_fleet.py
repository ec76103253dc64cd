"""Canaries on a real fleet (controller, agents, sim engines, a router following the controller, the openai
client sending throughout): a canary answering errors is rolled back with no request lost; one passing its
eval suite is promoted and the roll goes on; both show in events and status."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import Load, bring_up, cli, openai_client, routed, router_for, sim_model
from controller.test_webhook import Receiver, notification_yaml, receiver  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration

EVAL = """\
apiVersion: llmgw/v1
kind: EvalSuite
metadata: {name: capitals}
spec:
  cases:
    - {name: france, prompt: "What is the capital of France?", check: {contains: Paris}}
"""


def _rollout(gates: str, duration: str = "2s") -> str:
    return (
        "\n  rollout:\n    strategy: canary\n"
        f"    canary: {{weight: 50, duration: {duration}, gates: {{{gates}}}}}"
    )


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()
        c.agents.cleanup()


async def _model_status(cluster: Cluster, model: str) -> dict[str, Any]:
    status = await cluster.admin.get("/api/v1/status")  # type: ignore[union-attr]
    return next(x for x in status["models"] if x["model"] == model)


async def _canary_phase(cluster: Cluster, model: str, phase: str) -> dict[str, Any] | None:
    canary = (await _model_status(cluster, model)).get("canary")
    return canary if canary is not None and canary["phase"] == phase else None


async def test_a_canary_answering_errors_is_rolled_back_with_no_request_lost(
    cluster: Cluster,
    tmp_path: Path,
    receiver: Receiver,  # noqa: F811
) -> None:
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "hook-secret").write_text("s")
    rollout = _rollout("min_requests: 3, max_error_rate: 0.1, max_ttft_ratio: null", duration="30s")
    hook = notification_yaml(receiver.url, name="ci", events="[canary_verdict]")
    models = {"models/m.yaml": sim_model("m", 2, extra=rollout), "hook.yaml": hook}
    await bring_up(cluster, ["n1", "n2"], models)
    stable = {r["id"] for r in await cluster.wait_ready("m", 2)}
    router = router_for(tmp_path, cluster)
    try:
        client = openai_client(router)
        await routed(client, "m")
        load = Load(client, "m", workers=4)
        broken = sim_model("m", 2, extra=rollout, args="decode_ms_per_token: 2, error_rate: 1.0")
        tried = cluster.repo.write({"models/m.yaml": broken}, "an engine that answers 503")
        running = await wait_for(lambda: _canary_phase(cluster, "m", "running"), 30, "a canary running")
        # The status says it is in progress, with what it waits for. Before the load starts: under it the
        # canary's third failed request could end the canary before `status` looked (seen once in CI).
        assert (await _model_status(cluster, "m"))["health"] == "Progressing"
        code, out = await _in_thread(cli, cluster, "status")
        assert code == 0 and "canary running" in out, out
        async with load.running():
            failed = await wait_for(lambda: _canary_phase(cluster, "m", "failed"), 60, "the canary failed")
            canary_ids = set(failed["replicas"])
            assert canary_ids and not canary_ids & stable, (running, failed)
            assert "error rate 100.0%" in failed["verdict"], failed

            async def rolled_back() -> bool:
                ids = {r["id"] for r in await cluster.admin.replicas("m")}  # type: ignore[union-attr]
                return ids == stable

            await wait_for(rolled_back, 30, "the canary replica stopped, the stable ones left")
            answered_after = load.answered
            await wait_for(lambda: load.answered > answered_after + 10, 30, "the stable replicas serving on")
        await client.close()
    finally:
        router.stop()
    assert load.failures == [], load.failures[:5]
    events = [e for e in await cluster.events() if e["object"] == "m"]
    kinds = [e["kind"] for e in events]
    assert "canary_started" in kinds and "canary_failed" in kinds and "canary_promoted" not in kinds
    said = next(e for e in events if e["kind"] == "canary_failed")["message"]
    assert said.startswith("canary failed: rolled back, the stable replicas keep serving (error rate 100.0%")
    m = await _model_status(cluster, "m")
    assert m["canary"]["phase"] == "failed" and m["ready"] == 2
    metrics = await cluster.admin.metrics()  # type: ignore[union-attr]
    assert 'llmgw_controller_canary_verdicts_total{model="m",verdict="failed"} 1.0' in metrics
    # The repo's CI asked for the verdict (a Notification on canary_verdict): the revision it tried.
    await wait_for(lambda: receiver.delivered(), 30, "the verdict delivered")
    sent = json.loads(receiver.delivered()[0][1])
    assert sent["event"] == "canary_verdict" and sent["object"] == "m"
    assert sent["fields"]["verdict"] == "failed" and sent["fields"]["revision"] == tried


async def test_a_canary_passing_its_eval_suite_is_promoted_and_the_roll_goes_on(
    cluster: Cluster, tmp_path: Path
) -> None:
    rollout = _rollout("min_requests: 0, evals: [capitals], max_ttft_ratio: null")
    models = {"models/m.yaml": sim_model("m", 2, extra=rollout), "evals/capitals.yaml": EVAL}
    await bring_up(cluster, ["n1", "n2"], models)
    stable = {r["id"] for r in await cluster.wait_ready("m", 2)}
    # `llmgw eval` on demand: the stable replicas do not know their capitals (the sim answers in Greek).
    code, out = await _in_thread(cli, cluster, "eval", "capitals", "--model", "m")
    assert code == 1, out
    assert "  FAIL  france: does not contain 'Paris'" in out
    assert out.rstrip().endswith("failed: 0/1 cases, score 0 (threshold 1)")
    router = router_for(tmp_path, cluster)
    try:
        client = openai_client(router)
        await routed(client, "m")
        load = Load(client, "m")
        async with load.running():
            knows = sim_model("m", 2, extra=rollout, args="decode_ms_per_token: 2, answers: 'France=Paris'")
            cluster.repo.write({"models/m.yaml": knows}, "weights that know their capitals")
            promoted = await wait_for(
                lambda: _canary_phase(cluster, "m", "promoted"), 60, "the canary promoted"
            )
            assert "eval suite capitals passed" in promoted["verdict"], promoted
            assert promoted["evals"][0]["cases"][0]["passed"] is True

            async def rolled() -> bool:
                items = await cluster.admin.replicas("m")  # type: ignore[union-attr]
                ids = {r["id"] for r in items}
                ready = [r for r in items if r["state"] == "ready"]
                return not ids & stable and len(ready) == 2 and len(items) == 2

            await wait_for(rolled, 90, "every stable replica replaced")
        await client.close()
    finally:
        router.stop()
    assert load.failures == [], load.failures[:5]
    events = sorted((e for e in await cluster.events() if e["object"] == "m"), key=lambda e: e["time"])
    kinds = [e["kind"] for e in events]
    assert kinds.index("canary_started") < kinds.index("canary_eval") < kinds.index("canary_promoted")
    assert "canary_failed" not in kinds
    assert (await _model_status(cluster, "m"))["health"] == "Healthy"
    one = next(r["id"] for r in await cluster.admin.replicas("m"))  # type: ignore[union-attr]
    code, out = await _in_thread(cli, cluster, "eval", "capitals", "--model", "m", "--replica", one)
    assert code == 0, out
    assert f"suite capitals on m (replica {one})" in out and "  pass  france: contains 'Paris'" in out


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)
