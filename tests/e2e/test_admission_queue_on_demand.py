"""An on-demand model's first request is held and answered once its replica is ready: `llmgw up` (controller,
router, a real agent) on a small repo whose only model is an on-demand sim engine with a declared load time
longer than the router's old fixed 5 s wait. The request waits in the router's admission queue (seen in the
router's metrics while the engine loads), then is answered by the new replica."""

from __future__ import annotations

import asyncio
import shutil
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import DEFAULT_AGENT_PORTS, free_port, wait_for

from .up_process import EXAMPLE, START_S, Up, printed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), DEFAULT_AGENT_PORTS]

LOAD_MS = 8000  # the sim opens its port only after this: above the 5 s the router used to wait
MODEL = """apiVersion: llmgw/v1
kind: Model
metadata:
  name: sim-lazy
spec:
  context_length: 2048
  scaling: {min: 0, max: 1, idle_timeout: 10m}
  profiles:
    - name: sim
      engine: sim
      args: {decode_ms_per_token: 1, max_concurrency: 4, load_ms: LOAD}
""".replace("LOAD", str(LOAD_MS))
TENANTS = """apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: playground}
spec: {organization: acme}
"""


@pytest.fixture(scope="module")
def lazy_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("lazy-up")
    repo = tmp / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "tenants").mkdir()
    shutil.copytree(EXAMPLE / "nodes", repo / "nodes")
    shutil.copytree(EXAMPLE / "policies", repo / "policies")
    cluster = (EXAMPLE / "cluster.yaml").read_text()
    (repo / "cluster.yaml").write_text(cluster.split("  engines:")[0] + "  engines:\n    sim: {}\n")
    (repo / "models" / "lazy.yaml").write_text(MODEL)
    (repo / "tenants" / "acme.yaml").write_text(TENANTS)
    names = ("router", "router_metrics", "controller", "controller_metrics")
    run = Up(tmp, {name: free_port() for name in names}, llamacpp=False, repo=repo)
    run.start()
    try:
        yield run
    finally:
        run.kill_everything()


def _queued(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "llmgw_router_admission_queue_depth":
            return sum(s.value for s in family.samples)
    return 0.0


async def test_the_first_request_is_held_until_the_replica_is_ready(lazy_up: Up) -> None:
    p = printed(lazy_up)
    metrics = f"http://127.0.0.1:{lazy_up.ports['router_metrics']}/metrics"
    async with openai.AsyncOpenAI(base_url=p.base_url, api_key=p.key, max_retries=0, timeout=180) as c:
        await wait_for(
            lambda: asyncio.to_thread(_has_model, p.base_url, p.key), START_S, "sim-lazy listed by the router"
        )
        first = asyncio.create_task(
            c.chat.completions.create(
                model="sim-lazy", messages=[{"role": "user", "content": "wake up"}], max_tokens=3
            )
        )
        # Held in the router's queue while the controller places the replica and the engine loads.
        await wait_for(lambda: asyncio.to_thread(_queued, metrics), 60, "the request held in the queue")
        assert not first.done()
        reply = await asyncio.wait_for(first, 180)
        assert reply.model == "sim-lazy" and reply.usage is not None and reply.usage.completion_tokens == 3
        assert _queued(metrics) == 0
        again = await c.chat.completions.create(
            model="sim-lazy", messages=[{"role": "user", "content": "again"}], max_tokens=1
        )
        assert again.choices[0].message.content


def _has_model(base_url: str, key: str) -> bool:
    req = urllib.request.Request(base_url + "/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return b"sim-lazy" in r.read()
    except OSError:
        return False
