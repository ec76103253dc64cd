"""MIG: the agent reports a card in MIG mode as the instances carved from it (UUID, memory, a class from the card
and the profile), found by the nvidia-smi stand-in answering as driver R550 does (`--query-gpu` CSV with
mig.mode.current, `-L` for each MIG device's profile and UUID, `-q -x` for its memory); a card in MIG mode with
nothing carved stays out with its reason; placement treats instances as GPUs of their class and says why a card
is left out; the engine is given `CUDA_VISIBLE_DEVICES=MIG-<uuid>`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from llmgw_agent import engines, inventory, mig
from llmgw_agent.protocol import Gpu, Inventory, ShardSpec

from llmgw.controller.loops.shard_specs import StartInputs
from llmgw.core.fleet.views import GpuView, LiveNode, NodeView
from llmgw.core.placement import ShardPlacement, place

from .builders import entry, gpu_profile
from .test_placement import only, reasons_for

STANDIN = str(Path(__file__).parents[1] / "agent" / "standins" / "nvidia-smi")
A100 = "NVIDIA A100-SXM4-80GB"
MIG_A = "MIG-4f8c7d0e-1b2a-5c3d-9e8f-0a1b2c3d4e5f"
MIG_B = "MIG-6a7b8c9d-0e1f-5a2b-8c3d-4e5f6a7b8c9d"
MIG_C = "MIG-0c1d2e3f-4a5b-5c6d-9e8f-7a6b5c4d3e2f"
NODE: dict[str, Any] = {
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "gpus": [
        {
            "uuid": "GPU-0",
            "name": A100,
            "memory.total": 81920,
            "utilization.gpu": 0,
            "mig.mode.current": "Enabled",
            "mig_devices": [
                {"profile": "3g.40gb", "uuid": MIG_A, "memory": 40192},
                {"profile": "2g.20gb", "uuid": MIG_B, "memory": 19968},
                {"profile": "1g.10gb", "uuid": MIG_C, "memory": 9728},
            ],
        },
        {
            "uuid": "GPU-1",
            "name": A100,
            "memory.total": 81920,
            "utilization.gpu": 0,
            "mig.mode.current": "Enabled",
        },
        {
            "uuid": "GPU-2",
            "name": A100,
            "memory.total": 81920,
            "utilization.gpu": 5,
            "mig.mode.current": "Disabled",
        },
    ],
}
MIB = 2**20


@pytest.fixture
def reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Gpu]:
    state = tmp_path / "smi.json"
    state.write_text(json.dumps(NODE))
    monkeypatch.setenv("LLMGW_NVIDIA_SMI_STATE", str(state))
    gpus = inventory.run_nvidia_smi(STANDIN)
    assert gpus is not None
    return gpus


def test_a_card_in_mig_mode_is_reported_as_its_instances(reported: list[Gpu]) -> None:
    by_index = {g.index: g for g in reported}
    assert sorted(by_index) == [1, 2, 1000, 1001, 1002]
    three = by_index[mig.mig_index(0, 0)]
    assert (three.uuid, three.gpu_class, three.memory_bytes) == (MIG_A, "a100-80g-mig-3g.40gb", 40192 * MIB)
    assert (three.mig_card, three.mig_profile, three.unusable) == (0, "3g.40gb", None)
    assert by_index[1001].gpu_class == "a100-80g-mig-2g.20gb" and by_index[1002].uuid == MIG_C
    uncarved = by_index[1]
    assert uncarved.gpu_class == "a100-80g" and uncarved.unusable is not None
    assert uncarved.unusable.startswith("in MIG mode with no MIG instance carved")
    whole = by_index[2]
    assert (whole.gpu_class, whole.unusable, whole.mig_card) == ("a100-80g", None, None)


def test_an_unreadable_mig_listing_leaves_the_card_out_with_why(tmp_path: Path) -> None:
    broken = tmp_path / "nvidia-smi"
    row = f"0, GPU-0, {A100}, 81920, 0, Enabled"
    broken.write_text(f'#!/bin/sh\ncase "$1" in --query-gpu*) echo "{row}";; *) exit 9;; esac\n')
    broken.chmod(0o755)
    (card,) = inventory.run_nvidia_smi(str(broken)) or []
    assert card.index == 0 and card.unusable is not None and "MIG instances are unknown" in card.unusable


def _views(gpus: list[Gpu]) -> NodeView:
    return NodeView(
        name="a",
        cpu_cores=64,
        memory_bytes=512 * 2**30,
        disk_free_bytes=2000 * 2**30,
        engines={"vllm": "0.10.1"},
        gpus=tuple(GpuView(g.index, g.gpu_class, g.memory_bytes, unusable=g.unusable) for g in gpus),
    )


def test_placement_takes_instances_as_gpus_of_their_class_and_says_why_a_card_is_out(
    reported: list[Gpu],
) -> None:
    node = _views(reported)
    sliced = {"m": entry(gpu_profile(gpus=1, gpu_class="a100-80g-mig-3g.40gb"))}
    assert [s.gpus for s in only(place(sliced, [node], [])).shards] == [(1000,)]
    whole = {"m": entry(gpu_profile(gpus=2, gpu_class="a100-80g"))}
    assert place(whole, [node], []).unplaced[0].missing == 1
    assert LiveNode.from_view(node).view().gpus == node.gpus  # `plan` reads the same through its live state
    (words,) = reasons_for("m", whole, [node]).values()
    assert words.startswith(
        "has 1 free a100-80g, needs 2 (1 left out: gpu 1: in MIG mode with no MIG instance"
    )


def test_the_engine_is_given_the_instance_by_its_mig_uuid(reported: list[Gpu]) -> None:
    link = SimpleNamespace(inventory=Inventory(gpus=reported))
    starts = StartInputs(None, {}, {"a": link}, None, frozenset())  # type: ignore[arg-type]
    devices = starts._cuda_devices(ShardPlacement("a", 0, (1001,)))
    assert devices == [MIG_B]
    assert starts._cuda_devices(ShardPlacement("a", 0, (2,))) == []  # a whole card: by its index
    spec = ShardSpec(replica_id="r", model="m", engine="vllm", gpus=[1001], cuda_devices=devices)
    plan = engines.launch_plan(spec, engines.LaunchContext("127.0.0.1", 8000, "/w", "/tmp/w"))
    assert plan.env["CUDA_VISIBLE_DEVICES"] == MIG_B
    whole = ShardSpec(replica_id="r", model="m", engine="vllm", gpus=[2])
    assert engines.launch_plan(whole, engines.LaunchContext("127.0.0.1", 8000, "/w", "/tmp/w")).env == {
        "CUDA_VISIBLE_DEVICES": "2"
    }
