"""What this node has: CPU, memory, disks of the model dirs, GPUs, engines installed.

Parsers are pure functions over text so they can be tested against recorded outputs; `collect` does the I/O.
Whatever the machine does not report stays None: unknown is never zero, and "no GPUs" ([]) is said only when
nvidia-smi ran and listed none.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from llmgw_agent.engines import EXECUTABLES
from llmgw_agent.protocol import Disk, EngineInstall, Gpu, Inventory

NVIDIA_SMI_QUERY = [
    "--query-gpu=index,uuid,name,memory.total,utilization.gpu",
    "--format=csv,noheader,nounits",
]
SHARED_FSTYPES = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "glusterfs",
    "ceph",
    "cephfs",
    "lustre",
    "beegfs",
    "gpfs",
}
SHARED_FSTYPE_PREFIXES = ("fuse.", "9p")
_UNREPORTED = {"[n/a]", "[not supported]", "n/a", "[unknown error]", ""}


def parse_cpuinfo(text: str) -> int | None:
    count = sum(1 for line in text.splitlines() if re.match(r"processor\s*:", line))
    return count or None


def parse_meminfo(text: str) -> int | None:
    for line in text.splitlines():
        m = re.match(r"MemTotal:\s+(\d+)\s*kB", line)
        if m:
            return int(m.group(1)) * 1024
    return None


def _field(raw: str) -> str | None:
    value = raw.strip()
    return None if value.lower() in _UNREPORTED else value


def gpu_class(name: str | None, memory_bytes: int | None) -> str | None:
    """A placement class like `h100-80g` from the marketing name and memory, or None when either is unknown."""
    if not name or not memory_bytes:
        return None
    words = re.sub(r"^((nvidia|tesla|geforce|quadro)\s+)+", "", name.strip().lower())
    parts = [w for w in re.split(r"[\s\-_]+", words) if w]
    if len(parts) >= 2 and parts[0] == "rtx":
        parts = [parts[0] + parts[1]]  # "rtx 4090" -> "rtx4090"
    model = parts[0] if parts else ""
    if not model:
        return None
    gib = memory_bytes / 2**30
    # Marketing sizes: 81559 MiB is sold as 80 GB, 40960 MiB as 40 GB.
    nominal = min(
        (8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 141, 192), key=lambda g: abs(g - gib)
    )
    if abs(nominal - gib) > 0.1 * nominal:
        nominal = round(gib)
    return f"{model}-{nominal}g"


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of `nvidia-smi --query-gpu=index,uuid,name,memory.total,utilization.gpu --format=csv,noheader,nounits`."""
    gpus: list[Gpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5:
            raise ValueError(f"nvidia-smi row has {len(cols)} columns, expected 5: {line!r}")
        index, uuid, name, mem, util = cols[0], cols[1], ", ".join(cols[2:-2]), cols[-2], cols[-1]
        mem_mib = _field(mem)
        memory = int(float(mem_mib)) * 2**20 if mem_mib and _is_number(mem_mib) else None
        util_v = _field(util)
        gpus.append(
            Gpu(
                index=int(index),
                uuid=_field(uuid),
                name=_field(name),
                memory_bytes=memory,
                gpu_class=gpu_class(_field(name), memory),
                utilisation=float(util_v) if util_v and _is_number(util_v) else None,
            )
        )
    return gpus


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def run_nvidia_smi(binary: str | None = None) -> list[Gpu] | None:
    """GPUs as nvidia-smi reports them; None when it is absent or fails (unknown, not "no GPUs")."""
    exe = binary or shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        # "No devices were found" exits non-zero on some drivers: that is a clear "none".
        text = (out.stdout + out.stderr).lower()
        return [] if "no devices were found" in text else None
    try:
        return parse_nvidia_smi(out.stdout)
    except ValueError:
        return None


def parse_mounts(text: str) -> dict[str, str]:
    """mount point -> filesystem type, from /proc/mounts."""
    mounts: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mounts[parts[1].replace("\\040", " ")] = parts[2]
    return mounts


def fstype_for(path: str, mounts: Mapping[str, str]) -> str | None:
    best = ""
    real = os.path.realpath(path)
    for point in mounts:
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best = point
    return mounts.get(best) if best else None


def is_shared(fstype: str | None) -> bool | None:
    if fstype is None:
        return None
    return fstype in SHARED_FSTYPES or fstype.startswith(SHARED_FSTYPE_PREFIXES)


def disks_for(model_dirs: Sequence[str], mounts: Mapping[str, str]) -> list[Disk]:
    """One entry per filesystem (grouped by st_dev) holding the model dirs."""
    seen: dict[int, Disk] = {}
    for d in model_dirs:
        try:
            st = os.stat(d)
            vfs = os.statvfs(d)
        except OSError:
            continue
        if st.st_dev in seen:
            continue
        fstype = fstype_for(d, mounts)
        seen[st.st_dev] = Disk(
            path=d,
            filesystem_id=f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}",
            total_bytes=vfs.f_blocks * vfs.f_frsize,
            free_bytes=vfs.f_bavail * vfs.f_frsize,
            shared=is_shared(fstype),
            fstype=fstype,
        )
    return list(seen.values())


def engines_installed(
    configured: Mapping[str, Mapping[str, str | None]], path_env: str | None = None
) -> dict[str, EngineInstall]:
    """Engines present: sim always; others named in the config or found on PATH, never by running them.

    `configured` is {engine: {"path": ..., "version": ...}} from the agent config.
    """
    found: dict[str, EngineInstall] = {
        "sim": EngineInstall(path=None, version=configured.get("sim", {}).get("version"))
    }
    for engine, conf in configured.items():
        if engine == "sim":
            continue
        path = conf.get("path")
        if path and os.access(path, os.X_OK):
            found[engine] = EngineInstall(path=path, version=conf.get("version"))
    for engine, names in EXECUTABLES.items():
        if engine in found:
            continue
        for name in names:
            path = shutil.which(name, path=path_env)
            if path:
                found[engine] = EngineInstall(path=path, version=configured.get(engine, {}).get("version"))
                break
    return found


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def collect(
    model_dirs: Sequence[str],
    configured_engines: Mapping[str, Mapping[str, str | None]],
    labels: Mapping[str, str],
    override_file: str | None = None,
) -> Inventory:
    """The node's inventory; fields from the override file (JSON) replace what was measured."""
    cpuinfo = _read("/proc/cpuinfo")
    meminfo = _read("/proc/meminfo")
    mounts = parse_mounts(_read("/proc/mounts") or "")
    inv = Inventory(
        cpu_cores=(parse_cpuinfo(cpuinfo) if cpuinfo else None) or os.cpu_count(),
        memory_bytes=parse_meminfo(meminfo) if meminfo else None,
        disks=disks_for(model_dirs, mounts),
        gpus=run_nvidia_smi(),
        engines=engines_installed(configured_engines),
        labels=dict(labels),
    )
    if override_file:
        inv = apply_override(inv, json.loads(Path(override_file).read_text()))
    return inv


def apply_override(inv: Inventory, override: Mapping[str, object]) -> Inventory:
    """Replace the measured fields named in `override` (same shape as Inventory) — for tests and odd machines."""
    merged = inv.model_dump(by_alias=True)
    for key, value in override.items():
        if key == "labels" and isinstance(value, dict):
            merged["labels"] = {**merged.get("labels", {}), **value}
        else:
            merged[key] = value
    return Inventory.model_validate(merged)
