"""Heat and power of the node: GPUs from nvidia-smi, CPU and inlet temperatures from hwmon, CPU package power
from RAPL. Parsers and arithmetic are pure; `ThermalSampler` does the I/O, at most once per `MIN_INTERVAL_S`.

Sources, as documented by NVIDIA (driver R550, `nvidia-smi --help-query-gpu`) and the Linux kernel (6.x,
Documentation/hwmon/sysfs-interface.rst and Documentation/power/powercap/powercap.rst):
- `nvidia-smi --query-gpu=index,temperature.gpu,temperature.memory,power.draw,enforced.power.limit,
  clocks_throttle_reasons.active --format=csv,noheader,nounits`: degrees C, W, and the active throttle reasons
  as a hex bit mask (NVML's nvmlClocksThrottleReason bits; R535 renamed the field clocks_event_reasons and kept
  this name);
- `/sys/class/hwmon/hwmonN/name` and `tempK_input` (millidegrees C) with an optional `tempK_label`;
- `/sys/class/powercap/intel-rapl:N/{name,energy_uj,max_energy_range_uj}`: a package zone's energy counter in
  microjoules, which wraps at max_energy_range_uj; power is the difference over two samples, so the first
  sample has none. Since kernel 5.10 energy_uj is readable by root only: an agent that cannot read it reports
  no package power, never 0.
Whatever is not measured is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmgw_agent.health import smi_field, smi_number
from llmgw_agent.protocol import GpuThermal, NodeThermals

__all__ = [
    "MIN_INTERVAL_S",
    "THERMAL_QUERY",
    "Rapl",
    "ThermalSampler",
    "hwmon_temperatures",
    "parse_gpu_thermals",
    "rapl_watts",
    "read_rapl",
    "throttle_reasons",
]

MIN_INTERVAL_S = 10.0
THERMAL_FIELDS = (
    "index",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "enforced.power.limit",
    "clocks_throttle_reasons.active",
)
THERMAL_QUERY = [f"--query-gpu={','.join(THERMAL_FIELDS)}", "--format=csv,noheader,nounits"]
# NVML's throttle (clock event) reason bits, in llmgw's words.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
CPU_CHIPS = frozenset({"coretemp", "k10temp", "zenpower", "cpu_thermal", "soc_thermal"})
_INLET = re.compile(r"inlet|ambient|intake", re.IGNORECASE)
_PACKAGE = re.compile(r"^(package id \d+|tdie|tctl)$", re.IGNORECASE)
_RAPL_ZONE = re.compile(r"^intel-rapl:\d+$")


def throttle_reasons(raw: str) -> list[str] | None:
    """The reasons a `clocks_throttle_reasons.active` mask (`0x0000000000000044`) names; None: not measured."""
    text = smi_field(raw)
    if text is None:
        return None
    try:
        mask = int(text, 16)
    except ValueError:
        return None
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def parse_gpu_thermals(text: str) -> list[GpuThermal]:
    """Rows of THERMAL_QUERY; raises ValueError on a row without its six columns."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = line.split(",")
        if len(cols) != len(THERMAL_FIELDS) or not cols[0].strip().isdigit():
            raise ValueError(
                f"nvidia-smi row has {len(cols)} columns, expected {len(THERMAL_FIELDS)}: {line!r}"
            )
        out.append(
            GpuThermal(
                index=int(cols[0]),
                temperature_c=smi_number(cols[1]),
                memory_temperature_c=smi_number(cols[2]),
                power_draw_w=smi_number(cols[3]),
                power_limit_w=smi_number(cols[4]),
                throttle_reasons=throttle_reasons(cols[5]),
            )
        )
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def hwmon_temperatures(root: Path) -> tuple[float | None, float | None]:
    """(hottest CPU package, hottest inlet) in degrees C from a /sys/class/hwmon tree. A CPU chip's package
    sensor (`Package id N`, `Tdie`, `Tctl`) counts where it has one, else its hottest sensor."""
    cpu: list[float] = []
    inlet: list[float] = []
    for chip in sorted(root.glob("hwmon*")):
        name = _read(chip / "name") or ""
        readings: list[tuple[str, float]] = []
        for sensor in sorted(chip.glob("temp*_input")):
            raw = _read(sensor)
            if raw is None or not raw.lstrip("-").isdigit():
                continue
            label = _read(chip / sensor.name.replace("_input", "_label")) or ""
            readings.append((label, int(raw) / 1000.0))
        inlet += [c for label, c in readings if _INLET.search(label)]
        if name in CPU_CHIPS and readings:
            package = [c for label, c in readings if _PACKAGE.match(label)]
            cpu.append(max(package or [c for _, c in readings]))
    return (max(cpu) if cpu else None), (max(inlet) if inlet else None)


@dataclass(frozen=True)
class Rapl:
    energy_uj: int
    max_energy_range_uj: int


def read_rapl(root: Path) -> dict[str, Rapl]:
    """Package zone name -> its energy counter, from a /sys/class/powercap tree (top-level intel-rapl:N zones:
    the packages; their subzones, core and dram, are inside the package's figure)."""
    out: dict[str, Rapl] = {}
    for zone in sorted(root.glob("intel-rapl:*")):
        if not _RAPL_ZONE.match(zone.name):
            continue
        name, energy, top = (_read(zone / f) for f in ("name", "energy_uj", "max_energy_range_uj"))
        if name and energy and energy.isdigit() and top and top.isdigit():
            out[name] = Rapl(int(energy), int(top))
    return out


def rapl_watts(before: Mapping[str, Rapl], after: Mapping[str, Rapl], seconds: float) -> dict[str, float]:
    """Average power per package between two readings `seconds` apart; a counter that wrapped is counted
    through its range. A package read only once has none."""
    if seconds <= 0:
        return {}
    out = {}
    for name, now in after.items():
        then = before.get(name)
        if then is None:
            continue
        used = now.energy_uj - then.energy_uj
        if used < 0:
            used += now.max_energy_range_uj + 1
        out[name] = round(used / 1e6 / seconds, 3)
    return out


class ThermalSampler:
    """The node's heat and power, measured at most once per `min_interval_s` (a heartbeat and a scrape in the
    same interval share one sample). Blocking: call `sample` from a thread."""

    def __init__(
        self,
        smi_binary: str | None = None,
        hwmon_root: Path = Path("/sys/class/hwmon"),
        powercap_root: Path = Path("/sys/class/powercap"),
        min_interval_s: float = MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.smi_binary, self.hwmon_root, self.powercap_root = smi_binary, hwmon_root, powercap_root
        self.min_interval_s, self.clock = min_interval_s, clock
        self.last: NodeThermals | None = None
        self.samples = 0  # how many were measured (not served from the last one)
        self._taken = 0.0
        self._rapl: tuple[float, dict[str, Rapl]] | None = None
        # The heartbeat's thread and a scrape's may ask at once: one measures, the other gets its sample.
        self._lock = threading.Lock()

    def sample(self) -> NodeThermals:
        with self._lock:
            return self._sample()

    def _sample(self) -> NodeThermals:
        now = self.clock()
        if self.last is not None and now - self._taken < self.min_interval_s:
            return self.last
        rapl = read_rapl(self.powercap_root)
        package = rapl_watts(self._rapl[1], rapl, now - self._rapl[0]) if self._rapl else {}
        self._rapl = (now, rapl)
        cpu, inlet = hwmon_temperatures(self.hwmon_root)
        self.last = NodeThermals(
            taken_at=time.time(),
            gpus=self._gpus(),
            cpu_temperature_c=cpu,
            inlet_temperature_c=inlet,
            cpu_package_power_w=package or None,
        )
        self._taken = now
        self.samples += 1
        return self.last

    def _gpus(self) -> list[GpuThermal] | None:
        exe = self.smi_binary or shutil.which("nvidia-smi")
        if not exe:
            return None
        try:
            out = subprocess.run(
                [exe, *THERMAL_QUERY], capture_output=True, text=True, timeout=10, check=False
            )
            return parse_gpu_thermals(out.stdout) if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None
