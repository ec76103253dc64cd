"""Node health as Prometheus series: GPUs from nvidia-smi, host CPU, memory, the agent's filesystems, network.

Parsers are pure functions over text (tested against recorded outputs); `sample` does the I/O and `render`
writes the text exposition format. The agent ships without prometheus_client (its dependencies are aiohttp
and pydantic only), so the families are declared here, once, and the docs test reads the same table.

Absent is absent: no nvidia-smi, no GPU series; a field nvidia-smi answers `[N/A]` or `[Not Supported]` for
has no series, never a 0; a file under /proc that cannot be read leaves its families out.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw_agent.protocol import NodeThermals

PREFIX = "llmgw_agent_"
# Order matters: parse_gpu_health reads the columns by position.
GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
)
NVIDIA_SMI_HEALTH_QUERY = [f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]
_UNREPORTED = {"[n/a]", "[not supported]", "n/a", "[unknown error]", "[gpu is lost]", ""}
# /proc/stat's cpu line, in its order.
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# Interfaces that carry no traffic between machines.
SKIPPED_INTERFACES = ("lo",)


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # counter, gauge
    help: str
    labels: tuple[str, ...] = ()


FAMILIES: tuple[Family, ...] = (
    Family(
        PREFIX + "info", "gauge", "1, labelled with the agent's version and node name", ("version", "node")
    ),
    Family(
        PREFIX + "time_seconds", "gauge", "The agent's wall clock (Unix time) when it answered the scrape"
    ),
    Family(PREFIX + "nvidia_smi_up", "gauge", "1 when nvidia-smi answered the last query, 0 when it failed"),
    Family(PREFIX + "gpu_info", "gauge", "1 for each GPU nvidia-smi lists", ("gpu", "uuid", "name")),
    Family(PREFIX + "gpu_utilisation_ratio", "gauge", "GPU busy share, 0..1", ("gpu",)),
    Family(PREFIX + "gpu_memory_used_bytes", "gauge", "GPU memory in use", ("gpu",)),
    Family(PREFIX + "gpu_memory_total_bytes", "gauge", "GPU memory in all", ("gpu",)),
    Family(PREFIX + "gpu_temperature_celsius", "gauge", "GPU core temperature", ("gpu",)),
    Family(PREFIX + "gpu_power_watts", "gauge", "GPU power draw", ("gpu",)),
    Family(
        PREFIX + "gpu_ecc_uncorrected_errors",
        "gauge",
        "Uncorrectable ECC errors: volatile (since the driver loaded) or aggregate (the card's lifetime)",
        ("gpu", "scope"),
    ),
    Family(PREFIX + "gpu_memory_temperature_celsius", "gauge", "GPU memory (HBM) temperature", ("gpu",)),
    Family(PREFIX + "gpu_power_limit_watts", "gauge", "GPU power limit the driver enforces", ("gpu",)),
    Family(
        PREFIX + "gpu_throttled",
        "gauge",
        "1 for each reason the GPU's clocks are held down now (sw_power_cap, hw_thermal_slowdown, ...)",
        ("gpu", "reason"),
    ),
    Family(PREFIX + "cpu_temperature_celsius", "gauge", "The hottest CPU package temperature (hwmon)"),
    Family(PREFIX + "inlet_temperature_celsius", "gauge", "The hottest inlet/ambient temperature (hwmon)"),
    Family(
        PREFIX + "cpu_package_power_watts", "gauge", "CPU package power (RAPL), by package zone", ("package",)
    ),
    Family(
        PREFIX + "power_draw_watts", "gauge", "What the node was measured to draw: GPUs plus CPU packages"
    ),
    Family(PREFIX + "cpu_seconds", "counter", "CPU time of all cores by mode, from /proc/stat", ("mode",)),
    Family(PREFIX + "cpu_cores", "gauge", "CPU cores the kernel lists"),
    Family(PREFIX + "memory_total_bytes", "gauge", "Host memory (MemTotal)"),
    Family(PREFIX + "memory_available_bytes", "gauge", "Host memory available to new work (MemAvailable)"),
    Family(
        PREFIX + "filesystem_size_bytes",
        "gauge",
        "Size of a filesystem the agent uses, by role (weights, models, state) and the path it uses",
        ("role", "path"),
    ),
    Family(
        PREFIX + "filesystem_free_bytes",
        "gauge",
        "Space a non-root process may still write on a filesystem the agent uses",
        ("role", "path"),
    ),
    Family(PREFIX + "network_receive_bytes", "counter", "Bytes received, by interface", ("device",)),
    Family(PREFIX + "network_transmit_bytes", "counter", "Bytes sent, by interface", ("device",)),
    Family(
        PREFIX + "engine_exits",
        "counter",
        "Engine processes that exited without being asked to stop, by model and engine",
        ("model", "engine"),
    ),
)
FAMILY = {f.name: f for f in FAMILIES}


def exported_names() -> dict[str, str]:
    """metric -> type as scraped (counters with `_total`), for the docs test."""
    return {f.name + ("_total" if f.kind == "counter" else ""): f.kind for f in FAMILIES}


# ------------------------------------------------------------------------------------------------ parsers


@dataclass(frozen=True)
class GpuHealth:
    index: int
    uuid: str | None
    name: str | None
    utilisation_ratio: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_celsius: float | None
    power_watts: float | None
    ecc_volatile: int | None
    ecc_aggregate: int | None
    lost: bool = False  # a column read "[GPU is lost]": the driver lost the card (an Xid error)


def smi_field(raw: str) -> str | None:
    """A value nvidia-smi printed, or None for what it did not measure (`[N/A]`, `[Not Supported]`, ...)."""
    value = raw.strip()
    return None if value.lower() in _UNREPORTED else value


def smi_number(raw: str) -> float | None:
    """A number nvidia-smi printed (finite), or None for what it did not measure or printed otherwise."""
    value = smi_field(raw)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _mib(raw: str) -> int | None:
    value = smi_number(raw)
    return None if value is None else int(value) * 2**20


def _count(raw: str) -> int | None:
    value = smi_number(raw)
    return None if value is None else int(value)


def parse_gpu_health(text: str) -> list[GpuHealth]:
    """Rows of `nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits`; raises ValueError on a row
    that does not have the columns asked for. A name may hold commas: it is what lies between uuid and the
    seven numeric columns."""
    tail = len(GPU_FIELDS) - 3
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < len(GPU_FIELDS) or not cols[0].isdigit():
            raise ValueError(f"nvidia-smi row has {len(cols)} columns, expected {len(GPU_FIELDS)}: {line!r}")
        numbers = cols[-tail:]
        util = smi_number(numbers[0])
        gpus.append(
            GpuHealth(
                index=int(cols[0]),
                uuid=smi_field(cols[1]),
                name=smi_field(", ".join(cols[2:-tail])),
                utilisation_ratio=None if util is None else util / 100.0,
                memory_used_bytes=_mib(numbers[1]),
                memory_total_bytes=_mib(numbers[2]),
                temperature_celsius=smi_number(numbers[3]),
                power_watts=smi_number(numbers[4]),
                ecc_volatile=_count(numbers[5]),
                ecc_aggregate=_count(numbers[6]),
                lost=any(c.lower() == "[gpu is lost]" for c in cols[1:]),
            )
        )
    return gpus


def parse_proc_stat(text: str, ticks_per_second: float) -> dict[str, float]:
    """CPU seconds of all cores by mode, from /proc/stat's aggregate `cpu` line; {} when it is not there."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = parts[1 : 1 + len(CPU_MODES)]
            return {mode: int(v) / ticks_per_second for mode, v in zip(CPU_MODES, values, strict=False)}
    return {}


def parse_meminfo(text: str) -> dict[str, int]:
    """MemTotal and MemAvailable in bytes (whichever the kernel lists)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            value = rest.split()
            if value and value[0].isdigit():
                out[key] = int(value[0]) * 1024
    return out


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """interface -> (received bytes, sent bytes), from /proc/net/dev; loopback left out."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        cols = rest.split()
        name = name.strip()
        if not sep or len(cols) < 9 or name in SKIPPED_INTERFACES:
            continue
        out[name] = (int(cols[0]), int(cols[8]))
    return out


# ----------------------------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    """One look at the node; None (or a missing key) is "not known here", never zero."""

    taken_at: float
    gpus: list[GpuHealth] | None = None  # None: no nvidia-smi, or it failed (see smi_up)
    smi_up: bool | None = None  # None: there is no nvidia-smi on this node
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    cpu_cores: int | None = None
    memory: dict[str, int] = field(default_factory=dict)
    filesystems: list[tuple[str, str, int, int]] = field(default_factory=list)  # role, path, size, free
    network: dict[str, tuple[int, int]] = field(default_factory=dict)
    thermals: NodeThermals | None = None  # the agent's last heat-and-power sample (llmgw_agent.thermals)


@dataclass(frozen=True)
class SmiResult:
    gpus: list[GpuHealth] | None
    error: str | None  # why it failed, in nvidia-smi's own words when it gave any


def gpu_faults(gpus: Iterable[GpuHealth]) -> dict[int, str]:
    """GPU index -> why nothing new may be placed on it. Uncorrectable ECC errors since the driver loaded mean
    the card's memory cannot be trusted until it is reset; a lost card answers nothing. Aggregate (lifetime)
    errors alone are history, not a fault: a reset card that counts no new ones is placeable again."""
    faults: dict[int, str] = {}
    for g in gpus:
        if g.lost:
            faults[g.index] = "nvidia-smi reports it lost (an Xid error): reset it or reboot the node"
        elif g.ecc_volatile:
            faults[g.index] = (
                f"{g.ecc_volatile} uncorrectable ECC error(s) since the driver loaded: reset it "
                f"(`nvidia-smi -r -i {g.index}`) or reboot the node"
            )
    return faults


def run_gpu_query(binary: str | None = None, timeout_s: float = 10.0) -> SmiResult | None:
    """nvidia-smi's health query; None when there is no nvidia-smi here (a node without NVIDIA GPUs)."""
    exe = binary or shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, *NVIDIA_SMI_HEALTH_QUERY], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return SmiResult(None, f"nvidia-smi did not answer within {timeout_s:.0f}s")
    except OSError as exc:
        return SmiResult(None, f"nvidia-smi could not run: {exc}")
    said = (out.stdout + out.stderr).strip()
    if out.returncode != 0:
        if "no devices were found" in said.lower():
            return SmiResult([], None)
        return SmiResult(None, f"nvidia-smi exited {out.returncode}: {said[-300:] or 'no output'}")
    try:
        return SmiResult(parse_gpu_health(out.stdout), None)
    except ValueError as exc:
        return SmiResult(None, str(exc))


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def filesystems(paths: Iterable[tuple[str, str]]) -> list[tuple[str, str, int, int]]:
    """(role, path, size, free) for each (role, path) whose directory exists; a missing one (an unmounted
    filer looks like one) is left out rather than reported as an empty disk."""
    out = []
    for role, path in paths:
        try:
            vfs = os.statvfs(path)
        except OSError:
            continue
        out.append((role, path, vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize))
    return out


def sample(paths: Sequence[tuple[str, str]], smi_binary: str | None = None) -> Sample:
    """Everything `render` needs, measured now (blocking: call it from a thread)."""
    smi = run_gpu_query(smi_binary)
    stat = _read("/proc/stat")
    meminfo = _read("/proc/meminfo")
    net = _read("/proc/net/dev")
    return Sample(
        taken_at=time.time(),
        gpus=None if smi is None else smi.gpus,
        smi_up=None if smi is None else smi.error is None,
        cpu_seconds=parse_proc_stat(stat, os.sysconf("SC_CLK_TCK")) if stat else {},
        cpu_cores=os.cpu_count(),
        memory=parse_meminfo(meminfo) if meminfo else {},
        filesystems=filesystems(paths),
        network=parse_net_dev(net) if net else {},
    )


# ---------------------------------------------------------------------------------------------- rendering


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number_text(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


Series = list[tuple[Mapping[str, str], float]]


def _gpu_series(gpus: Sequence[GpuHealth]) -> dict[str, Series]:
    out: dict[str, Series] = {}

    def put(name: str, labels: Mapping[str, str], value: float | None) -> None:
        if value is not None:
            out.setdefault(PREFIX + name, []).append((labels, value))

    for g in gpus:
        gpu = {"gpu": str(g.index)}
        put("gpu_info", {**gpu, "uuid": g.uuid or "", "name": g.name or ""}, 1)
        put("gpu_utilisation_ratio", gpu, g.utilisation_ratio)
        put("gpu_memory_used_bytes", gpu, g.memory_used_bytes)
        put("gpu_memory_total_bytes", gpu, g.memory_total_bytes)
        put("gpu_temperature_celsius", gpu, g.temperature_celsius)
        put("gpu_power_watts", gpu, g.power_watts)
        put("gpu_ecc_uncorrected_errors", {**gpu, "scope": "volatile"}, g.ecc_volatile)
        put("gpu_ecc_uncorrected_errors", {**gpu, "scope": "aggregate"}, g.ecc_aggregate)
    return out


def _thermal_series(t: NodeThermals) -> dict[str, Series]:
    """The heat-and-power families; a reading not measured has no series (GPU core temperature and draw are
    the health query's own families)."""
    out: dict[str, Series] = {}

    def put(name: str, labels: Mapping[str, str], value: float | None) -> None:
        if value is not None:
            out.setdefault(PREFIX + name, []).append((labels, value))

    for g in t.gpus or []:
        gpu = {"gpu": str(g.index)}
        put("gpu_memory_temperature_celsius", gpu, g.memory_temperature_c)
        put("gpu_power_limit_watts", gpu, g.power_limit_w)
        for reason in g.throttle_reasons or []:
            put("gpu_throttled", {**gpu, "reason": reason}, 1)
    put("cpu_temperature_celsius", {}, t.cpu_temperature_c)
    put("inlet_temperature_celsius", {}, t.inlet_temperature_c)
    for package, watts in sorted((t.cpu_package_power_w or {}).items()):
        put("cpu_package_power_watts", {"package": package}, watts)
    put("power_draw_watts", {}, t.power_draw_watts())
    return out


def series_of(
    s: Sample, *, version: str, node: str, engine_exits: Mapping[tuple[str, str], int]
) -> dict[str, Series]:
    """metric family -> its series, only for what is known."""
    out: dict[str, Series] = {
        PREFIX + "info": [({"version": version, "node": node}, 1)],
        PREFIX + "time_seconds": [({}, s.taken_at)],
    }
    if s.smi_up is not None:
        out[PREFIX + "nvidia_smi_up"] = [({}, 1 if s.smi_up else 0)]
    out.update(_gpu_series(s.gpus or []))
    if s.thermals is not None:
        out.update(_thermal_series(s.thermals))
    if s.cpu_seconds:
        out[PREFIX + "cpu_seconds"] = [({"mode": m}, v) for m, v in s.cpu_seconds.items()]
    if s.cpu_cores is not None:
        out[PREFIX + "cpu_cores"] = [({}, s.cpu_cores)]
    for key, name in (("MemTotal", "memory_total_bytes"), ("MemAvailable", "memory_available_bytes")):
        if key in s.memory:
            out[PREFIX + name] = [({}, s.memory[key])]
    if s.filesystems:
        out[PREFIX + "filesystem_size_bytes"] = [
            ({"role": r, "path": p}, size) for r, p, size, _ in s.filesystems
        ]
        out[PREFIX + "filesystem_free_bytes"] = [
            ({"role": r, "path": p}, free) for r, p, _, free in s.filesystems
        ]
    if s.network:
        out[PREFIX + "network_receive_bytes"] = [({"device": d}, rx) for d, (rx, _) in s.network.items()]
        out[PREFIX + "network_transmit_bytes"] = [({"device": d}, tx) for d, (_, tx) in s.network.items()]
    if engine_exits:
        out[PREFIX + "engine_exits"] = [
            ({"model": model, "engine": engine}, n) for (model, engine), n in sorted(engine_exits.items())
        ]
    return out


def render(series: Mapping[str, Series]) -> str:
    """The Prometheus text exposition (format 0.0.4) of `series`, families in FAMILIES' order."""
    lines: list[str] = []
    for family in FAMILIES:
        rows = series.get(family.name)
        if not rows:
            continue
        name = family.name + ("_total" if family.kind == "counter" else "")
        lines.append(f"# HELP {name} {family.help}")
        lines.append(f"# TYPE {name} {family.kind}")
        for labels, value in rows:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(
                f"{name}{{{text}}} {_number_text(value)}" if text else f"{name} {_number_text(value)}"
            )
    return "\n".join(lines) + "\n"
