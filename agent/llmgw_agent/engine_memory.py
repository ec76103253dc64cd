"""What memory each engine holds: the resident set of its process group (from /proc) and the GPU memory its
processes use (nvidia-smi's compute apps).

An engine is a process group (the pass-through, the engine, its workers), so both are sums over the group.
Unknown is None, never 0: no /proc entry for the group, or nvidia-smi absent or failing. nvidia-smi that ran
and lists none of the group's pids is a measured 0 (a CPU engine on a GPU node).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

NVIDIA_SMI_APPS = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat_fields(raw: str) -> list[str]:
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def process_groups(proc_root: Path = Path("/proc")) -> dict[int, tuple[int, int]]:
    """pid -> (process group, resident bytes) for every process /proc shows."""
    found: dict[int, tuple[int, int]] = {}
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields((entry / "stat").read_text())
        except OSError:  # gone between the listing and the read
            continue
        if len(fields) < 22 or fields[0] == "Z":
            continue
        found[int(entry.name)] = (int(fields[2]), int(fields[21]) * PAGE_SIZE)
    return found


def parse_compute_apps(text: str) -> dict[int, int]:
    """pid -> used bytes from `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`
    (MiB); a pid on several GPUs is summed. Raises ValueError on a row it cannot read."""
    used: dict[int, int] = {}
    for line in text.splitlines():
        if not line.strip() or "no running" in line.lower():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 2:
            raise ValueError(f"nvidia-smi compute-apps row has {len(cols)} columns, expected 2: {line!r}")
        pid, mib = int(cols[0]), cols[1]
        if mib.isdigit():  # "[N/A]" on some drivers: that pid's use is unknown, not 0
            used[pid] = used.get(pid, 0) + int(mib) * 1024 * 1024
    return used


def gpu_memory_by_pid(binary: str | None = None) -> dict[int, int] | None:
    """pid -> GPU bytes used; None when nvidia-smi is absent or fails (unknown)."""
    exe = binary or shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, *NVIDIA_SMI_APPS], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return parse_compute_apps(out.stdout)
    except ValueError:
        return None


def by_group(
    pgids: Iterable[int], procs: dict[int, tuple[int, int]], gpu: dict[int, int] | None
) -> dict[int, tuple[int | None, int | None]]:
    """pgid -> (resident bytes, GPU bytes), each None when unknown (pure: the reads are the callers')."""
    out: dict[int, tuple[int | None, int | None]] = {}
    for pgid in pgids:
        members = [pid for pid, (group, _) in procs.items() if group == pgid]
        rss = sum(procs[pid][1] for pid in members) if members else None
        used = None if gpu is None or not members else sum(gpu.get(pid, 0) for pid in members)
        out[pgid] = (rss, used)
    return out


def measure(pgids: Iterable[int], nvidia_smi: str | None = None) -> dict[int, tuple[int | None, int | None]]:
    """Reads /proc and runs nvidia-smi (blocking: call it in a thread)."""
    wanted = list(pgids)
    if not wanted:
        return {}
    return by_group(wanted, process_groups(), gpu_memory_by_pid(nvidia_smi))
