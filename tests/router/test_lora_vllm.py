"""LoRA adapters on vLLM, against the vLLM stand-in (tests/agent/standins/vllm: the real CLI's flags, refusing
others; the runtime LoRA API only with VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM mounts it). vLLM itself needs
a GPU and does not run here. Shown: the exact start command the agent builds for a shard that carries an
adapter, the adapter served by name through a real router, and an adapter added later loaded at runtime on
exactly one replica (the affinity rule), once, with the exact call vLLM takes."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from llmgw_agent.engines import LaunchContext, launch_plan
from llmgw_agent.protocol import ShardAdapter, ShardSpec, WeightSource
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator
from llmgw_router.path.service import Router, RouterOptions
from support import free_port, wait_for, wait_until

from llmgw.core.snapshot import RouterSnapshot
from llmgw.store.records import UsageRecord

from .test_integration import KEY_P1, KEY_P2, keys

pytestmark = pytest.mark.integration

STANDIN = Path(__file__).parents[1] / "agent" / "standins" / "vllm"
ENGINE_KEY = "vllm-engine-key"


class Usage:
    def __init__(self) -> None:
        self.rows: list[UsageRecord] = []

    def record(self, rec: UsageRecord) -> None:
        self.rows.append(rec)


USAGE = Usage()
V1, V2 = "support-v1", "support-v2"
PATHS = {V1: "/srv/adapters/support-v1", V2: "/srv/adapters/support-v2"}


def _get(url: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {ENGINE_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as answer:
        return json.loads(answer.read())


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def shard(replica: str) -> ShardSpec:
    return ShardSpec(
        replica_id=replica,
        model="base",
        engine="vllm",
        context_length=2048,
        slots=4,
        api_key=ENGINE_KEY,
        served_model_name="base",
        adapters=[ShardAdapter(name=V1, source=WeightSource(path=PATHS[V1]), rank=8)],
    )


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    procs, urls = [], {}
    try:
        for replica in ("rep-a", "rep-b"):
            workdir = tmp_path_factory.mktemp(replica)
            port = free_port()
            ctx = LaunchContext(
                "127.0.0.1", port, "org/base-model", str(workdir), str(STANDIN), adapters=((V1, PATHS[V1]),)
            )
            plan = launch_plan(shard(replica), ctx)
            assert plan.argv[2:] == [
                "org/base-model",
                "--served-model-name",
                "base",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-model-len",
                "2048",
                "--max-num-seqs",
                "4",
                "--enforce-eager",  # a CPU shard (no GPUs): the CPU build would recompile at every start
                "--enable-lora",
                "--lora-modules",
                f"{V1}={PATHS[V1]}",
                "--max-loras",
                "1",
                "--max-lora-rank",
                "8",
            ], plan.argv
            assert plan.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"  # the agent's, never the repo's
            env = {k: v for k, v in os.environ.items() if k != "VLLM_ALLOW_RUNTIME_LORA_UPDATING"}
            log = (workdir / "vllm.log").open("wb")
            procs.append(subprocess.Popen(plan.argv, env={**env, **plan.env}, stdout=log, stderr=log))
            urls[replica] = f"http://127.0.0.1:{port}"
        for replica, url in urls.items():
            wait_until(lambda url=url: _up(url), 60, f"the vLLM stand-in for {replica}")  # type: ignore[misc]
        yield urls
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def snapshot(urls: dict[str, str]) -> RouterSnapshot:
    return RouterSnapshot.model_validate(
        {
            "revision": "vllm-lora-1",
            "models": {"base": {"context_length": 2048, "capabilities": ["chat"]}},
            "adapters": {
                V1: {"base": "base", "path": PATHS[V1], "projects": ["p1"]},
                V2: {"base": "base", "path": PATHS[V2]},  # any project that may use the base
            },
            "tenants": {
                "organizations": {"acme": {}},
                "projects": {
                    "p1": {"organization": "acme", "models": ["base", "support-*"]},
                    "p2": {"organization": "acme", "models": ["base"]},
                },
            },
            "endpoints": [
                {
                    "replica_id": replica,
                    "model": "base",
                    "engine": "vllm",
                    "base_url": url,
                    "api_key": ENGINE_KEY,
                    "slots": 4,
                    "adapters": [V1],
                }
                for replica, url in urls.items()
            ],
        }
    )


@pytest.fixture
async def gateway(engines: dict[str, str]) -> AsyncIterator[str]:
    router = Router(RouterOptions(), auth=Authenticator(keys()), usage=USAGE)
    router.apply_snapshot(snapshot(engines))
    listeners: Listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        yield f"http://127.0.0.1:{listeners.api_port}/v1"
    finally:
        await listeners.close()


def lora_calls(url: str, since: int = 0) -> list[list[Any]]:
    return [c for c in _get(url + "/standin/calls")[since:]]


async def test_adapters_are_served_by_name_and_a_new_one_is_loaded_once_on_one_replica(
    engines: dict[str, str], gateway: str
) -> None:
    # The start registered the adapter: the engine lists it beside its base.
    for url in engines.values():
        listed = {m["id"]: m for m in _get(url + "/v1/models")["data"]}
        assert listed[V1]["parent"] == "base" and listed[V1]["root"] == PATHS[V1]
        assert V2 not in listed
    before = {r: len(lora_calls(u)) for r, u in engines.items()}
    async with openai.AsyncOpenAI(base_url=gateway, api_key=KEY_P1, max_retries=0, timeout=30) as c:
        models = {m.id: m.model_dump() for m in (await c.models.list()).data}
        assert set(models) == {"base", V1, V2} and models[V2]["parent"] == "base"
        for name in (V1, V2, V2, "base"):
            await c.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
    calls = {r: lora_calls(u, before[r]) for r, u in engines.items()}
    loads = {r: [body for path, body in got if path == "/v1/load_lora_adapter"] for r, got in calls.items()}
    # Neither held support-v2 and both were idle: the first by id loads it, exactly once, with vLLM's call.
    assert loads == {"rep-a": [{"lora_name": V2, "lora_path": PATHS[V2]}], "rep-b": []}, calls
    sent = {
        r: [body["model"] for path, body in got if path == "/v1/chat/completions"] for r, got in calls.items()
    }
    assert sent["rep-a"].count(V2) == 2 and V2 not in sent["rep-b"], sent  # then it stays where it is loaded
    assert sorted(sent["rep-a"] + sent["rep-b"]) == sorted([V1, V2, V2, "base"])
    # Billed to the base model, the adapter named in the usage row.
    rows = await wait_for(lambda: USAGE.rows if len(USAGE.rows) >= 4 else None, 10, "4 usage rows")
    assert [(r.model, (r.decision or {}).get("adapter")) for r in rows[-4:]] == [
        ("base", V1),
        ("base", V2),
        ("base", V2),
        ("base", None),
    ]
    async with openai.AsyncOpenAI(base_url=gateway, api_key=KEY_P2, max_retries=0, timeout=30) as other:
        assert {m.id for m in (await other.models.list()).data} == {"base", V2}
        with pytest.raises(openai.PermissionDeniedError):
            await other.chat.completions.create(
                model=V1, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
