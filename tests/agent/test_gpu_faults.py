"""Faulty GPUs (issue 19): the agent marks a card with uncorrectable ECC errors or lost to the driver, so
placement leaves it alone; lifetime errors alone and a failed health query mark nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from llmgw_agent import health, inventory

from .test_health import H100, RTX

STANDINS = Path(__file__).parent / "standins"


@pytest.fixture
def smi_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(STANDINS / "nvidia-smi", bin_dir / "nvidia-smi")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    state = tmp_path / "nvidia-smi.json"
    monkeypatch.setenv("LLMGW_NVIDIA_SMI_STATE", str(state))
    return state


def test_a_card_with_new_uncorrectable_ecc_errors_is_marked_and_the_others_are_not(smi_state: Path) -> None:
    broken = H100 | {"ecc.errors.uncorrected.volatile.total": 2}
    smi_state.write_text(json.dumps({"driver_version": "550.54.15", "gpus": [H100, broken, RTX]}))
    gpus = inventory.with_faults(inventory.run_nvidia_smi())
    assert gpus is not None
    faults = {g.index: g.fault for g in gpus}
    assert faults[0] is None, "aggregate (lifetime) errors alone are history, not a fault"
    assert faults[1] == (
        "2 uncorrectable ECC error(s) since the driver loaded: reset it (`nvidia-smi -r -i 1`) or reboot the node"
    )
    assert faults[2] is None, "a card without ECC reporting is not faulty: unknown is not a fault"


def test_a_lost_card_is_marked_from_the_health_row() -> None:
    row = "0, [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], "
    row += "[GPU is lost], [GPU is lost], [GPU is lost]\n"
    gpus = health.parse_gpu_health(row)
    assert health.gpu_faults(gpus) == {
        0: "nvidia-smi reports it lost (an Xid error): reset it or reboot the node"
    }


def test_a_health_query_that_fails_marks_nothing(smi_state: Path) -> None:
    smi_state.write_text(json.dumps({"gpus": [H100 | {"ecc.errors.uncorrected.volatile.total": 5}]}))
    listed = inventory.run_nvidia_smi()
    failed = health.SmiResult(None, "nvidia-smi did not answer within 10s")
    gpus = inventory.with_faults(listed, failed)
    assert gpus is not None and [g.fault for g in gpus] == [None]


def test_the_inventory_carries_the_fault_to_the_controller(smi_state: Path) -> None:
    smi_state.write_text(
        json.dumps(
            {"gpus": [H100, H100 | {"ecc.errors.uncorrected.volatile.total": 1}], "driver_version": "550"}
        )
    )
    inv = inventory.collect([], None, {})
    wire = inv.model_dump(by_alias=True, mode="json")
    assert [g["fault"] is not None for g in wire["gpus"]] == [False, True]
