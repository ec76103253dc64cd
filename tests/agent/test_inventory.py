"""Inventory parsing against recorded outputs: unknown stays None, "no GPUs" only when nvidia-smi said so."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from llmgw_agent import inventory
from llmgw_agent.protocol import Inventory, dump

ONE_CARD = "0, GPU-5e1c7a52-1b2f-4c8e-9b1e-1f2a3b4c5d6e, NVIDIA H100 80GB HBM3, 81559, 37\n"
EIGHT_CARDS = "".join(
    f"{i}, GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd, NVIDIA A100-SXM4-40GB, 40960, {i * 10}\n"
    for i in range(8)
)
OLD_DRIVER = "0, GPU-11111111-2222-3333-4444-555555555555, Tesla K80, 11441, [Not Supported]\n"
NA_UTIL = "0, GPU-11111111-2222-3333-4444-555555555555, NVIDIA L4, 23034, [N/A]\n"


def test_one_card() -> None:
    (gpu,) = inventory.parse_nvidia_smi(ONE_CARD)
    assert gpu.index == 0 and gpu.uuid == "GPU-5e1c7a52-1b2f-4c8e-9b1e-1f2a3b4c5d6e"
    assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.memory_bytes == 81559 * 2**20
    assert gpu.gpu_class == "h100-80g" and gpu.utilisation == 37.0


def test_eight_cards() -> None:
    gpus = inventory.parse_nvidia_smi(EIGHT_CARDS)
    assert [g.index for g in gpus] == list(range(8))
    assert {g.gpu_class for g in gpus} == {"a100-40g"}
    assert gpus[7].utilisation == 70.0


@pytest.mark.parametrize("text", [OLD_DRIVER, NA_UTIL])
def test_driver_without_utilisation_reports_none_not_zero(text: str) -> None:
    (gpu,) = inventory.parse_nvidia_smi(text)
    assert gpu.utilisation is None
    assert gpu.memory_bytes is not None and gpu.gpu_class is not None


def fake_smi(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_nvidia_smi_runs_with_the_exact_query(tmp_path: Path) -> None:
    args_file = tmp_path / "args"
    smi = fake_smi(tmp_path, f'echo "$@" > {args_file}\nprintf "%s" "{ONE_CARD.strip()}, Disabled"\n')
    gpus = inventory.run_nvidia_smi(smi)
    assert gpus is not None and len(gpus) == 1
    assert args_file.read_text().split() == inventory.NVIDIA_SMI_QUERY


def test_no_driver_is_unknown_but_no_devices_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    assert inventory.run_nvidia_smi() is None
    failing = fake_smi(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2\nexit 9\n',
    )
    assert inventory.run_nvidia_smi(failing) is None
    none = fake_smi(tmp_path, 'echo "No devices were found"\nexit 6\n')
    assert inventory.run_nvidia_smi(none) == []


def test_memory_unknown_when_meminfo_has_no_memtotal() -> None:
    assert inventory.parse_meminfo("MemFree: 100 kB\nBuffers: 3 kB\n") is None
    assert inventory.parse_meminfo("MemTotal:       65843212 kB\n") == 65843212 * 1024
    # An absent field stays absent on the wire too, not 0.
    wire = json.loads(dump(Inventory(cpu_cores=4)))
    assert wire["memory_bytes"] is None and wire["gpus"] is None


def test_cpuinfo() -> None:
    text = "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\nmodel name\t: x\n"
    assert inventory.parse_cpuinfo(text) == 2
    assert inventory.parse_cpuinfo("") is None


def test_disks_grouped_by_filesystem_and_shared_flagged(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    mounts = inventory.parse_mounts(f"server:/export {tmp_path} nfs4 rw 0 0\n/dev/sda1 / ext4 rw 0 0\n")
    disks = inventory.disks_for([str(a), str(b)], mounts)
    assert len(disks) == 1  # same st_dev: one filesystem
    (disk,) = disks
    assert disk.shared is True and disk.fstype == "nfs4"
    assert disk.total_bytes and disk.free_bytes is not None
    local = inventory.disks_for([str(a)], inventory.parse_mounts("/dev/sda1 / ext4 rw 0 0\n"))
    assert local[0].shared is False


def test_the_cache_filesystem_is_marked_and_a_filer_named_by_its_export(tmp_path: Path) -> None:
    models, cache = tmp_path / "models", tmp_path / "cache"
    models.mkdir()
    cache.mkdir()
    table = inventory.parse_mount_table(f"filer:/export {tmp_path} nfs4 rw 0 0\n/dev/sda1 / ext4 rw 0 0\n")
    mounts = {p: t for p, (_, t) in table.items()}
    sources = {p: src for p, (src, _) in table.items()}
    (disk,) = inventory.disks_for([str(models)], mounts, cache_dir=str(cache), sources=sources)
    assert disk.holds_cache is True  # one filesystem holds both: reported once, marked as the cache's
    assert disk.mount_source == "filer:/export" and disk.shared is True
    missing = inventory.disks_for([str(tmp_path / "gone")], mounts, cache_dir=str(tmp_path / "gone2"))
    assert missing == []  # an unmounted filer is skipped, never a full disk


def test_cpu_flags_keep_the_ones_engines_need() -> None:
    text = "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile ht\n"
    assert inventory.parse_cpu_flags(text) == ["amx_tile", "avx", "avx2", "avx512f", "fma", "sse4_2"]
    assert inventory.parse_cpu_flags("Features\t: fp asimd sve\n") == ["asimd", "sve"]
    assert inventory.parse_cpu_flags("processor\t: 0\n") is None  # not read: unknown, not "none"


def test_override_file_fakes_a_big_node(tmp_path: Path) -> None:
    override = tmp_path / "inv.json"
    gpus = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30, "class": "h100-80g"}
        for i in range(8)
    ]
    override.write_text(
        json.dumps({"cpu_cores": 64, "memory_bytes": 64 * 2**30, "gpus": gpus, "labels": {"zone": "a"}})
    )
    inv = inventory.collect([str(tmp_path)], {}, {"rack": "1"}, str(override))
    assert inv.cpu_cores == 64 and inv.memory_bytes == 64 * 2**30
    assert inv.gpus is not None and len(inv.gpus) == 8 and inv.gpus[0].gpu_class == "h100-80g"
    assert inv.labels == {"rack": "1", "zone": "a"}
    assert json.loads(dump(inv))["gpus"][0]["class"] == "h100-80g"


def test_collect_on_this_machine() -> None:
    inv = inventory.collect([os.getcwd()], {}, {})
    assert inv.cpu_cores and inv.cpu_cores >= 1
    assert inv.arch and inv.cpu_flags is not None
    assert inv.glibc is None or inv.glibc[0].isdigit()
    assert inv.memory_bytes and inv.memory_bytes > 0
    assert inv.disks and inv.disks[0].total_bytes
