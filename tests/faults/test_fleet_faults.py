"""Faults on a real fleet (controller, agents, sim engines, a router process): each test breaks one thing and
asserts what was kept — requests answered, engines not restarted (same PIDs), the last good revision."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from controller.helpers import model_yaml
from observability.tools import require_tool
from support import free_port, pid_alive, wait_for, wait_until

from faults.cluster import Cluster
from faults.procs import start_router_following

pytestmark = pytest.mark.integration

KEY = "sk-llmgw-" + "e" * 43
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()


def pids(items: list[dict[str, Any]]) -> dict[str, int]:
    return {r["id"]: r["pid"] for r in items}


async def _passes_over(cluster: Cluster, n: int) -> bool:
    assert cluster.admin is not None
    return bool((await cluster.admin.get("/api/v1/status"))["reconcile"]["passes"] >= n)


async def _some_passes(cluster: Cluster, more: int = 3) -> None:
    assert cluster.admin is not None
    passes = (await cluster.admin.get("/api/v1/status"))["reconcile"]["passes"]
    await wait_for(lambda: _passes_over(cluster, passes + more), 30, f"{more} more reconcile passes")


# ------------------------------------------------------------------ agent killed and restarted


async def test_agent_killed_and_restarted_adopts_its_engines(cluster: Cluster) -> None:
    await cluster.bring_up(["n1"], {"models/a.yaml": model_yaml("sim-a", min_=2)})
    before = pids(await cluster.wait_ready("sim-a", 2))
    killed_at = time.time()
    cluster.agents.stop("n1", signal.SIGKILL)
    assert all(pid_alive(p) for p in before.values()), "engines outlive their agent"

    cluster.agents.start("n1", cluster.address)

    def readopted() -> int:
        log = "".join(p.read_text() for p in (cluster.tmp / "agents" / "n1").glob("agent-*.log"))
        return log.count("re-adopted shard")

    # The controller may still show the replicas ready from before the kill: wait for the new agent itself.
    await wait_for(lambda: readopted() >= 2, 60, "the restarted agent re-adopting both shards")
    after = pids(await cluster.wait_ready("sim-a", 2, "both replicas ready again after the agent restart"))
    await _some_passes(cluster)
    assert after == before, "the same replicas with the same engine processes"
    assert pids(await cluster.wait_ready("sim-a", 2)) == before
    events = await cluster.events(killed_at)
    assert not any(e["kind"] == "replica_start" for e in events), events
    assert readopted() == 2, "each shard adopted once"


# ------------------------------------------------------------------ agents cut off from the controller


def _client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=30)


async def _answered(client: openai.AsyncOpenAI, model: str, n: int) -> int:
    ok = 0
    for i in range(n):
        r = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"fault {i}"}], max_tokens=4
        )
        ok += 1 if r.choices and r.choices[0].message.content else 0
    return ok


async def _wait_routed(client: openai.AsyncOpenAI, model: str, what: str) -> None:
    """Wait until a request for `model` is answered through the router (refusals meanwhile are expected)."""

    async def routed() -> bool:
        try:
            return await _answered(client, model, 1) == 1
        except openai.APIError:
            return False

    await wait_for(routed, 30, what)


def _router_connected(metrics_url: str) -> float | None:
    import urllib.request

    with urllib.request.urlopen(metrics_url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("llmgw_router_controller_connected "):
                return float(line.split()[1])
    return None


async def test_controller_gone_engines_keep_serving_through_the_router(
    cluster: Cluster, tmp_path: Path
) -> None:
    await cluster.bring_up(["n1", "n2"], {"models/a.yaml": model_yaml("sim-a", min_=2)})
    before = pids(await cluster.wait_ready("sim-a", 2))
    router = start_router_following(tmp_path, [cluster.address], KEY)
    try:
        async with _client(router.api) as client:
            await _wait_routed(client, "sim-a", "the router to get sim-a's endpoints from the controller")
            assert await _answered(client, "sim-a", 10) == 10

            await cluster.stop_controller()
            await asyncio.to_thread(
                lambda: wait_until(
                    lambda: _router_connected(router.metrics) == 0.0, 30, "router sees it gone"
                )
            )
            # No controller: every request is still answered, by the same engines.
            assert await _answered(client, "sim-a", 40) == 40
            assert all(pid_alive(p) for p in before.values())

            # The controller comes back before the agents do (theirs is the longer backoff): the router
            # reconnects to a controller that knows no replica yet, and must not be told "no endpoints".
            agents = [p.pid for p in cluster.agents.procs.values()]
            for pid in agents:
                os.kill(pid, signal.SIGSTOP)
            try:
                await cluster.start_controller()
                await asyncio.to_thread(
                    lambda: wait_until(lambda: _router_connected(router.metrics) == 1.0, 30, "router back")
                )
                assert await _answered(client, "sim-a", 20) == 20
            finally:
                for pid in agents:
                    os.kill(pid, signal.SIGCONT)
            await cluster.wait_ready("sim-a", 2, "replicas adopted by the restarted controller")
            assert pids(await cluster.wait_ready("sim-a", 2)) == before
            assert await _answered(client, "sim-a", 10) == 10
    finally:
        router.stop()
    assert "Traceback" not in router.text()


# ------------------------------------------------------------------ an engine crash-looping

CRASHY = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: crashy}
spec:
  context_length: 4096
  scaling: {min: 1, max: 1}
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, args: {max_concurrency: 0}}   # the sim exits at start
"""


def _restarts(metrics: str, model: str) -> float:
    prefix = f'llmgw_controller_replica_restarts_total{{model="{model}"}} '
    return next((float(ln[len(prefix) :]) for ln in metrics.splitlines() if ln.startswith(prefix)), 0.0)


async def test_crash_looping_engine_backs_off_degrades_and_raises_the_alert(
    cluster: Cluster, tmp_path: Path
) -> None:
    admin = await cluster.bring_up(["n1"], {"models/crashy.yaml": CRASHY})
    samples: list[float] = []

    async def restarted(n: int) -> bool:
        value = _restarts(await admin.metrics(), "crashy")
        if not samples or samples[-1] != value:
            samples.append(value)
        return value >= n

    await wait_for(lambda: restarted(4), 90, "four restarts of crashy")

    async def starts() -> list[float] | None:
        found = sorted(e["time"] for e in await cluster.events() if e["kind"] == "replica_start")
        return found if len(found) >= 5 else None

    times = await wait_for(starts, 60, "five starts of crashy")
    gaps = [b - a for a, b in itertools.pairwise(times)][:4]
    # Each gap is start-up + failure detection (about the same every time) + the backoff (0.5, 1, 2, 4 s with
    # +-20% jitter): the fourth is at least 2.6 s longer than the first unless the backoff does not grow.
    assert gaps[3] > gaps[0] + 2.0, f"backoff must grow between attempts: {gaps}"
    await wait_for(lambda: restarted(4), 5, "the counter read once more")

    models = {m["model"]: m for m in (await admin.get("/api/v1/models"))["models"]}
    assert models["crashy"]["health"] == "Degraded" and models["crashy"]["failures"] >= 3
    assert 'llmgw_controller_model_health{health="Degraded",model="crashy"} 1.0' in await admin.metrics()
    failed = [e for e in await cluster.events() if e["kind"] == "replica_failed"]
    assert failed and "exit code" in failed[0]["message"], failed[:2]

    # The alert's own expression, over the counter values this controller really published.
    promtool = require_tool("promtool")
    values = " ".join(["0", *(str(int(v)) for v in samples)])  # from zero: increase() is then the last value
    last = int(samples[-1])
    test = {
        "rule_files": [str(ROOT / "observability" / "alerts.rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'llmgw_controller_replica_restarts_total{model="crashy",instance="c1",job="llmgw"}',
                        "values": f"{values} {values.split()[-1]}x20",
                    },
                    # The one controller leads (rules that read only the leader see it).
                    {"series": 'llmgw_controller_is_leader{instance="c1",job="llmgw"}', "values": "1x30"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "LlmgwReplicaCrashLooping",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "model": "crashy",
                                    "severity": "warning",
                                    "component": "controller",
                                },
                                "exp_annotations": _annotations("LlmgwReplicaCrashLooping", "crashy", last),
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "crashloop_test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    argv = [promtool, "test", "rules", str(path)]
    run = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def _annotations(alert: str, model: str, value: int) -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for this model and value (the two templates used)."""
    from ruamel.yaml import YAML

    rules = YAML(typ="safe").load((ROOT / "observability" / "alerts.rules.yml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
    out = {}
    for key, text in rule["annotations"].items():
        text = text.replace("{{ $labels.model }}", model)
        out[key] = text.replace('{{ $value | printf "%.0f" }}', str(value))
    return out


# ------------------------------------------------------------------ git remote unreachable


async def test_git_remote_unreachable_keeps_the_last_good_revision(cluster: Cluster) -> None:
    admin = await cluster.bring_up(["n1"], {"models/a.yaml": model_yaml("sim-a", min_=1)})
    before = pids(await cluster.wait_ready("sim-a", 1))
    applied = (await admin.get("/api/v1/status"))["applied"]["revision"]
    # rev-parse, not head.commit: a one-off git process, not GitPython's persistent cat-file ones
    assert applied == cluster.repo.git.git.rev_parse("HEAD") if cluster.repo.git else applied

    gone = cluster.repo.path.with_name("origin-unreachable")
    cluster.repo.path.rename(gone)
    try:

        async def failing() -> dict[str, Any] | None:
            status: dict[str, Any] = await admin.get("/api/v1/status")
            return status if status["source_error"] else None

        status = await wait_for(failing, 30, "status to say the source is failing")
        assert status["applied"]["revision"] == applied
        assert "llmgw_controller_source_up 0.0" in await admin.metrics()
        await _some_passes(cluster)
        assert pids(await cluster.wait_ready("sim-a", 1)) == before, (
            "nothing restarted while the repo is away"
        )
    finally:
        gone.rename(cluster.repo.path)

    async def recovered() -> bool:
        return (await admin.get("/api/v1/status"))["source_error"] is None

    await wait_for(recovered, 30, "the source to recover")
    assert "llmgw_controller_source_up 1.0" in await admin.metrics()
    assert pids(await cluster.wait_ready("sim-a", 1)) == before


# ------------------------------------------------------------------ weights fetch interrupted


class CuttingServer:
    """Serves one blob; the first full request is cut after `cut` bytes (Content-Length promised the whole)."""

    def __init__(self, blob: bytes, cut: int) -> None:
        self.blob, self.cut = blob, cut
        self.ranges: list[str | None] = []
        self.runner: web.AppRunner | None = None

    async def get(self, request: web.Request) -> web.StreamResponse:
        rng = request.headers.get("Range")
        self.ranges.append(rng)
        if rng:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            return web.Response(
                status=206,
                body=self.blob[start:],
                headers={"Content-Range": f"bytes {start}-{len(self.blob) - 1}/{len(self.blob)}"},
            )
        resp = web.StreamResponse(headers={"Content-Length": str(len(self.blob))})
        await resp.prepare(request)
        if len(self.ranges) == 1:
            await resp.write(self.blob[: self.cut])
            assert request.transport is not None
            request.transport.close()  # mid-body: the client has a part and an error
            return resp
        await resp.write(self.blob)
        return resp

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/weights/model.gguf", self.get)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}/weights/model.gguf"


async def test_interrupted_weights_fetch_resumes_and_never_uses_the_part(cluster: Cluster) -> None:
    blob = os.urandom(3 * 1024 * 1024 + 17)
    server = CuttingServer(blob, cut=1024 * 1024)
    url = await server.start()
    try:
        model = f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: fetched}}
spec:
  context_length: 4096
  source: {{url: "{url}", sha256: {hashlib.sha256(blob).hexdigest()}, size_bytes: {len(blob)}}}
  scaling: {{min: 1, max: 1}}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1}}
"""
        await cluster.bring_up(["n1"], {"models/fetched.yaml": model})
        ready = await cluster.wait_ready("fetched", 1, "the replica ready after the fetch resumed")
        assert pid_alive(ready[0]["pid"])
        assert server.ranges[0] is None
        resumed = [r for r in server.ranges[1:] if r]
        assert resumed and int(resumed[0].removeprefix("bytes=").split("-")[0]) > 0, server.ranges
        weights = cluster.tmp / "agents" / "n1" / "state" / "weights"
        files = [p for p in weights.rglob("*") if p.is_file()]
        assert not [p for p in files if p.name.endswith(".part")], files
        assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in files] == [
            hashlib.sha256(blob).hexdigest()
        ]
        failed = [
            e for e in await cluster.events() if e["kind"] in ("replica_failed", "replica_start_failed")
        ]
        assert failed, "the cut fetch failed its first replica rather than starting an engine on a part"
    finally:
        assert server.runner is not None
        await server.runner.cleanup()


async def test_agent_cut_off_its_engines_keep_serving_through_the_router(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The agent's link to a running controller is gone (the agent frozen, as a partition looks from the
    controller): the node goes Unreachable, and its engines, still healthy, keep being routed to."""
    admin = await cluster.bring_up(["n1"], {"models/a.yaml": model_yaml("sim-a", min_=1)})
    before = pids(await cluster.wait_ready("sim-a", 1))
    router = start_router_following(tmp_path, [cluster.address], KEY)
    agent = cluster.agents.procs["n1"].pid
    try:
        async with _client(router.api) as client:
            await _wait_routed(client, "sim-a", "sim-a through the router")
            os.kill(agent, signal.SIGSTOP)
            try:
                await wait_for(lambda: _node_state_is(cluster, "n1", "Unreachable"), 30, "n1 Unreachable")
                passes = (await admin.get("/api/v1/status"))["reconcile"]["passes"]
                await wait_for(lambda: _passes_over(cluster, passes + 2), 30, "passes after Unreachable")
                assert await _answered(client, "sim-a", 20) == 20
                assert (await admin.replicas("sim-a"))[0]["id"] in before, "kept, not replaced"
            finally:
                os.kill(agent, signal.SIGCONT)
            await wait_for(lambda: _node_state_is(cluster, "n1", "Ready"), 30, "n1 Ready again")
            assert pids(await cluster.wait_ready("sim-a", 1)) == before
            assert await _answered(client, "sim-a", 5) == 5
    finally:
        router.stop()


async def _node_state_is(cluster: Cluster, node: str, state: str) -> bool:
    assert cluster.admin is not None
    return await cluster.admin.node_state(node) == state
