"""MIG through the real controller: an agent registers the GPUs the nvidia-smi stand-in's MIG card gave it
(its instances, and a card in MIG mode with nothing carved); a model whose profile asks for a 3g.40gb instance
is started on the instance, told `CUDA_VISIBLE_DEVICES` as its `MIG-<uuid>`; a model asking for whole cards is
refused, and explain says the uncarved card is left out and why."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llmgw_agent import inventory
from llmgw_agent.protocol import Gpu
from support import wait_for

from .helpers import Admin, Repo, cluster_yaml, settings_for, start
from .test_hub import FakeAgent

STANDIN = str(Path(__file__).parents[1] / "agent" / "standins" / "nvidia-smi")
MIG_A = "MIG-4f8c7d0e-1b2a-5c3d-9e8f-0a1b2c3d4e5f"
A100 = "NVIDIA A100-SXM4-80GB"
SMI = {
    "driver_version": "550.54.15",
    "gpus": [
        {
            "uuid": "GPU-0",
            "name": A100,
            "memory.total": 81920,
            "utilization.gpu": 0,
            "mig.mode.current": "Enabled",
            "mig_devices": [{"profile": "3g.40gb", "uuid": MIG_A, "memory": 40192}],
        },
        {
            "uuid": "GPU-1",
            "name": A100,
            "memory.total": 81920,
            "utilization.gpu": 0,
            "mig.mode.current": "Enabled",
        },
    ],
}
MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: NAME}
spec:
  context_length: 4096
  scaling: {min: 1, max: 1}
  profiles:
    - {name: gpu, engine: sim, gpu_class: CLASS, gpus: GPUS, args: {decode_ms_per_token: 1}}
"""


def model(name: str, gpu_class: str, gpus: int) -> str:
    return MODEL.replace("NAME", name).replace("CLASS", gpu_class).replace("GPUS", str(gpus))


@pytest.fixture
def mig_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Gpu]:
    state = tmp_path / "smi.json"
    state.write_text(json.dumps(SMI))
    monkeypatch.setenv("LLMGW_NVIDIA_SMI_STATE", str(state))
    gpus = inventory.run_nvidia_smi(STANDIN)
    assert gpus is not None
    return gpus


@pytest.fixture
async def ctl(tmp_path: Path) -> AsyncIterator[Admin]:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write(
        {
            "cluster.yaml": cluster_yaml(),
            "sliced.yaml": model("sliced", "a100-80g-mig-3g.40gb", 1),
            "whole.yaml": model("whole", "a100-80g", 1),
        }
    )
    running, admin = await start(settings_for(tmp_path, repo.path))
    try:
        yield admin
    finally:
        await running.stop()


async def test_a_mig_instance_is_placed_and_named_to_the_engine_by_its_uuid(
    ctl: Admin, mig_gpus: list[Gpu]
) -> None:
    agent = FakeAgent(ctl, "mig-1")
    await agent.connect(gpus=mig_gpus)
    serving = asyncio.create_task(agent.serve())
    try:
        start = await wait_for(
            lambda: next((c for c in agent.commands if c.action == "start_shard" and c.spec), None),
            20,
            "the sliced model started",
        )
        assert start.spec is not None and start.spec.model == "sliced"
        assert (start.spec.gpus, start.spec.cuda_devices) == ([1000], [MIG_A])
        explained = await ctl.get("/api/v1/explain/whole")
        words = json.dumps(explained)
        assert (
            "has 0 free a100-80g, needs 1 (1 left out: gpu 1: in MIG mode with no MIG instance carved"
            in words
        ), words
        assert not [c for c in agent.commands if c.spec is not None and c.spec.model == "whole"]
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await agent.close()
