"""What this node has: CPU and its features, memory, disks of the model dirs and the cache, GPUs and driver.

Parsers are pure functions over text so they can be tested against recorded outputs; `collect` does the I/O.
Whatever the machine does not report stays None: unknown is never zero, and "no GPUs" ([]) is said only when
nvidia-smi ran and listed none.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from llmgw_agent import health, mig
from llmgw_agent.protocol import CachedWeights, Disk, EngineInstall, Gpu, Inventory, NodeCondition

NVIDIA_SMI_QUERY = [
    "--query-gpu=index,uuid,name,memory.total,utilization.gpu,mig.mode.current",
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
# CPU features an engine build may need (`requires.cpu_flags`): vector and matrix extensions, as cpuinfo names them.
CPU_FLAGS_REPORTED = frozenset(
    {
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx_vnni",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
        "asimd",
        "sve",
        "sve2",
    }
)
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


def parse_cards(text: str) -> tuple[list[Gpu], dict[int, str]]:
    """Rows of NVIDIA_SMI_QUERY: the cards, and each one's `mig.mode.current` (Enabled, Disabled, [N/A])."""
    rows = [line.rsplit(",", 1) for line in text.splitlines() if line.strip()]
    if any(len(row) < 2 for row in rows):
        raise ValueError("nvidia-smi rows lack the mig.mode.current column")
    cards = parse_nvidia_smi("\n".join(row[0] for row in rows))
    return cards, {card.index: row[1].strip() for card, row in zip(cards, rows, strict=True)}


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
        cards, modes = parse_cards(out.stdout)
    except ValueError:
        return None
    if not any(m.strip().lower() == "enabled" for m in modes.values()):
        return cards
    return mig_gpus(exe, cards, modes)


def _smi_text(exe: str, *args: str) -> str | None:
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def mig_gpus(exe: str, cards: list[Gpu], modes: Mapping[int, str]) -> list[Gpu]:
    """The cards with those in MIG mode as their instances (`nvidia-smi -L` for UUIDs and profiles, `-q -x` for
    memory). When either cannot be read, a MIG card is left out with that reason: its instances are unknown."""
    listing, xml_text = _smi_text(exe, "-L"), _smi_text(exe, "-q", "-x")
    try:
        memory = mig.parse_memory(xml_text) if xml_text is not None else None
    except ValueError:
        memory = None
    if listing is None or memory is None:
        why = "in MIG mode, and nvidia-smi -L / -q -x did not answer: its MIG instances are unknown"
        return [
            c.model_copy(update={"unusable": why}) if modes.get(c.index, "").lower() == "enabled" else c
            for c in cards
        ]
    return mig.instances_of(cards, modes, mig.parse_listing(listing), memory)


def parse_mounts(text: str) -> dict[str, str]:
    """mount point -> filesystem type, from /proc/mounts."""
    return {point: fstype for point, (_, fstype) in parse_mount_table(text).items()}


def parse_mount_table(text: str) -> dict[str, tuple[str, str]]:
    """mount point -> (source, filesystem type), from /proc/mounts; the source names a filer's export."""
    mounts: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mounts[parts[1].replace("\\040", " ")] = (parts[0], parts[2])
    return mounts


def mount_point_of(path: str, points: Iterable[str]) -> str | None:
    best = ""
    real = os.path.realpath(path)
    for point in points:
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best = point
    return best or None


def fstype_for(path: str, mounts: Mapping[str, str]) -> str | None:
    point = mount_point_of(path, mounts)
    return mounts.get(point) if point else None


def is_shared(fstype: str | None) -> bool | None:
    if fstype is None:
        return None
    return fstype in SHARED_FSTYPES or fstype.startswith(SHARED_FSTYPE_PREFIXES)


def disks_for(
    model_dirs: Sequence[str],
    mounts: Mapping[str, str],
    *,
    cache_dir: str | None = None,
    sources: Mapping[str, str] | None = None,
) -> list[Disk]:
    """One entry per filesystem (grouped by st_dev: free space belongs to the disk, not the path) holding the
    model dirs and the weights cache; the cache's is marked. A missing directory (an unmounted filer looks like
    one) is skipped, never reported as a full disk. `sources` is mount point -> mount source."""
    seen: dict[int, Disk] = {}
    cache_dev: int | None = None
    for d in [*model_dirs, *([cache_dir] if cache_dir else [])]:
        try:
            st = os.stat(d)
            vfs = os.statvfs(d)
        except OSError:
            continue
        if d == cache_dir:
            cache_dev = st.st_dev
        if st.st_dev in seen:
            continue
        fstype = fstype_for(d, mounts)
        point = mount_point_of(d, mounts)
        seen[st.st_dev] = Disk(
            path=d,
            filesystem_id=f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}",
            total_bytes=vfs.f_blocks * vfs.f_frsize,
            free_bytes=vfs.f_bavail * vfs.f_frsize,
            shared=is_shared(fstype),
            fstype=fstype,
            mount_source=(sources or {}).get(point) if point else None,
        )
    if cache_dir is not None:
        for dev, disk in seen.items():
            disk.holds_cache = dev == cache_dev
    return list(seen.values())


def parse_cpu_flags(text: str) -> list[str] | None:
    """The flags placement may ask for, from /proc/cpuinfo's first `flags` (x86) or `Features` (arm) line."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return sorted(f for f in value.split() if f in CPU_FLAGS_REPORTED)
    return None


def glibc_version() -> str | None:
    """The C library's version when it is glibc ("2.36"); None otherwise (musl) or when not known."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        return None
    if not text or not text.startswith("glibc "):
        return None
    return text.split()[1]


def run_driver_query(binary: str | None = None) -> str | None:
    """The NVIDIA driver version (nvidia-smi's first row); None when nvidia-smi is absent or says nothing."""
    exe = binary or shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return _field(first[0]) if out.returncode == 0 and first else None


def parse_cuda_version(xml_text: str) -> str | None:
    """The CUDA version the driver supports, `<cuda_version>` of `nvidia-smi -q -x` (its `CUDA Version`)."""
    m = re.search(r"<cuda_version>\s*([^<]*?)\s*</cuda_version>", xml_text)
    return _field(m.group(1)) if m else None


def run_cuda_query(binary: str | None = None) -> str | None:
    exe = binary or shutil.which("nvidia-smi")
    text = _smi_text(exe, "-q", "-x") if exe else None
    return parse_cuda_version(text) if text is not None else None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def with_faults(gpus: list[Gpu] | None, smi: health.SmiResult | None = None) -> list[Gpu] | None:
    """The GPUs with the faults nvidia-smi's health query shows (ECC, lost) marked, so placement leaves
    them alone. A health query that fails marks nothing: the GPUs' own listing answered, and unknown is not
    faulty."""
    if not gpus:
        return gpus
    smi = smi if smi is not None else health.run_gpu_query()
    faults = health.gpu_faults(smi.gpus) if smi is not None and smi.gpus else {}
    # A MIG instance shares its card's fault.
    out = []
    for g in gpus:
        fault = faults.get(g.mig_card if g.mig_card is not None else g.index)
        out.append(g.model_copy(update={"fault": fault}) if fault is not None else g)
    return out


def collect(
    model_dirs: Sequence[str],
    engines: Mapping[str, EngineInstall] | None,
    labels: Mapping[str, str],
    override_file: str | None = None,
    *,
    cache_dir: str | None = None,
    weights: Sequence[CachedWeights] | None = None,
    conditions: Sequence[NodeCondition] = (),
) -> Inventory:
    """The node's inventory; fields from the override file (JSON) replace what was measured. `engines` are
    the ones installed or declared whose probe passed (llmgw_agent.installs); None: not probed yet."""
    cpuinfo = _read("/proc/cpuinfo")
    meminfo = _read("/proc/meminfo")
    table = parse_mount_table(_read("/proc/mounts") or "")
    mounts = {point: fstype for point, (_, fstype) in table.items()}
    sources = {point: source for point, (source, _) in table.items()}
    gpus = with_faults(run_nvidia_smi())
    inv = Inventory(
        cpu_cores=(parse_cpuinfo(cpuinfo) if cpuinfo else None) or os.cpu_count(),
        memory_bytes=parse_meminfo(meminfo) if meminfo else None,
        disks=disks_for(model_dirs, mounts, cache_dir=cache_dir, sources=sources),
        gpus=gpus,
        engines=None if engines is None else dict(engines),
        labels=dict(labels),
        weights=None if weights is None else list(weights),
        cpu_flags=parse_cpu_flags(cpuinfo) if cpuinfo else None,
        arch=platform.machine() or None,
        glibc=glibc_version(),
        gpu_driver=run_driver_query() if gpus else None,
        cuda_version=run_cuda_query() if gpus else None,
        conditions=list(conditions),
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
