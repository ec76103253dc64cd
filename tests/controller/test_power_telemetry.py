"""Heat and power: the agent's sampler reads the nvidia-smi stand-in (driver R550's --query-gpu CSV) and sysfs
trees laid out as the kernel's hwmon and powercap classes (Linux 6.x), at most once per 10 s; RAPL package power
comes from two readings of the energy counter (through its wrap); unmeasured is absent, never zero. The sample
rides the heartbeat to a real controller, which shows it in /api/v1/nodes, on the console's node page and in the
node record placement reads (`power_draw_watts`); the agent's exporter publishes it as metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from llmgw_agent import health
from llmgw_agent.protocol import Heartbeat, NodeThermals, dump
from llmgw_agent.thermals import ThermalSampler, parse_gpu_thermals, throttle_reasons
from support import wait_for

from llmgw.controller.status import fleet as views

from .helpers import Admin, Repo, cluster_yaml, settings_for, start
from .test_hub import FakeAgent

STANDIN = str(Path(__file__).parents[1] / "agent" / "standins" / "nvidia-smi")
SMI: dict[str, object] = {
    "driver_version": "550.54.15",
    "gpus": [
        {
            "uuid": "GPU-0",
            "name": "NVIDIA H100 80GB HBM3",
            "temperature.gpu": 61,
            "temperature.memory": 72,
            "power.draw": 412.5,
            "enforced.power.limit": 700,
            "clocks_throttle_reasons.active": "0x0000000000000044",
        },
        {
            "uuid": "GPU-1",
            "name": "NVIDIA L4",
            "temperature.gpu": 44,
            "power.draw": 31.25,
            "enforced.power.limit": 72,
            "clocks_throttle_reasons.active": "0x0000000000000000",
        },
    ],
}


def test_the_csv_reads_throttle_bits_and_leaves_unmeasured_out() -> None:
    (gpu,) = parse_gpu_thermals("0, 61, [N/A], 412.50, 700.00, 0x0000000000000044\n")
    assert (gpu.temperature_c, gpu.memory_temperature_c, gpu.power_draw_w, gpu.power_limit_w) == (
        61,
        None,
        412.5,
        700,
    )
    assert gpu.throttle_reasons == ["sw_power_cap", "hw_thermal_slowdown"]
    assert throttle_reasons("[Not Supported]") is None and throttle_reasons("0x0") == []
    with pytest.raises(ValueError, match="expected 6"):
        parse_gpu_thermals("0, 61, 412.50\n")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def sysfs(root: Path) -> tuple[Path, Path]:
    """A hwmon class with an Intel coretemp chip, a board chip with an inlet sensor and an unrelated NVMe
    drive; a powercap class with two RAPL packages (and a core subzone, inside package 0's figure)."""
    hwmon, powercap = root / "hwmon", root / "powercap"
    for name, value in {
        "name": "coretemp",
        "temp1_label": "Package id 0",
        "temp1_input": "67000",
        "temp2_label": "Core 0",
        "temp2_input": "71000",
    }.items():
        _write(hwmon / "hwmon1" / name, value)
    for name, value in {
        "name": "nct6798",
        "temp1_label": "SYSTIN",
        "temp1_input": "30000",
        "temp7_label": "Inlet Temp",
        "temp7_input": "24500",
    }.items():
        _write(hwmon / "hwmon2" / name, value)
    for name, value in {"name": "nvme", "temp1_label": "Composite", "temp1_input": "45850"}.items():
        _write(hwmon / "hwmon3" / name, value)
    for zone, name, energy in (
        ("intel-rapl:0", "package-0", 1_000_000),
        ("intel-rapl:1", "package-1", 262_143_000_000),
        ("intel-rapl:0:0", "core", 5),
    ):
        _write(powercap / zone / "name", name)
        _write(powercap / zone / "energy_uj", str(energy))
        _write(powercap / zone / "max_energy_range_uj", "262143328850")
    return hwmon, powercap


@pytest.fixture
async def ctl(tmp_path: Path) -> AsyncIterator[Admin]:
    """A controller with no model: nothing is started on the scripted agent, which only sends heartbeats."""
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    running, admin = await start(settings_for(tmp_path, repo.path))
    try:
        yield admin
    finally:
        await running.stop()


@pytest.fixture
def smi_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "smi.json"
    state.write_text(json.dumps(SMI))
    monkeypatch.setenv("LLMGW_NVIDIA_SMI_STATE", str(state))
    return state


def test_sampled_at_most_every_10s_with_rapl_power_from_two_readings(tmp_path: Path, smi_state: Path) -> None:
    hwmon, powercap = sysfs(tmp_path)
    now = [100.0]
    sampler = ThermalSampler(STANDIN, hwmon, powercap, clock=lambda: now[0])
    first = sampler.sample()
    assert (first.cpu_temperature_c, first.inlet_temperature_c) == (67.0, 24.5)
    assert first.cpu_package_power_w is None  # one reading of a counter is no power yet
    assert first.power_draw_watts() == 443.75  # the GPUs alone, measured
    assert [g.memory_temperature_c for g in first.gpus or []] == [72, None]  # the L4 has no HBM sensor
    now[0] = 109.9
    assert sampler.sample() is first and sampler.samples == 1
    _write(powercap / "intel-rapl:0" / "energy_uj", str(1_000_000 + 1_500_000_000))  # 1500 J in 10 s
    _write(powercap / "intel-rapl:1" / "energy_uj", str(999_671_149))  # wrapped: 1000 J in 10 s
    now[0] = 110.0
    second = sampler.sample()
    assert sampler.samples == 2
    assert second.cpu_package_power_w == {"package-0": 150.0, "package-1": 100.0}
    assert second.power_draw_watts() == 693.75


def test_a_node_with_nothing_measured_reports_nothing(tmp_path: Path) -> None:
    bare = ThermalSampler(str(tmp_path / "no-nvidia-smi"), tmp_path / "hwmon", tmp_path / "powercap").sample()
    assert bare.model_dump(exclude={"taken_at"}) == {
        "gpus": None,
        "cpu_temperature_c": None,
        "inlet_temperature_c": None,
        "cpu_package_power_w": None,
    }
    assert bare.power_draw_watts() is None
    text = health.render(
        health.series_of(health.Sample(taken_at=1.0, thermals=bare), version="1", node="n", engine_exits={})
    )
    assert "temperature" not in text and "power" not in text


def test_the_exporter_publishes_the_sample(tmp_path: Path, smi_state: Path) -> None:
    hwmon, powercap = sysfs(tmp_path)
    sample = health.Sample(taken_at=1.0, thermals=ThermalSampler(STANDIN, hwmon, powercap).sample())
    text = health.render(health.series_of(sample, version="1", node="n", engine_exits={}))
    for line in (
        'llmgw_agent_gpu_memory_temperature_celsius{gpu="0"} 72',
        'llmgw_agent_gpu_power_limit_watts{gpu="1"} 72',
        'llmgw_agent_gpu_throttled{gpu="0",reason="hw_thermal_slowdown"} 1',
        "llmgw_agent_cpu_temperature_celsius 67",
        "llmgw_agent_inlet_temperature_celsius 24.5",
        "llmgw_agent_power_draw_watts 443.75",
    ):
        assert f"\n{line}\n" in text, line
    assert 'gpu_memory_temperature_celsius{gpu="1"}' not in text


async def test_the_heartbeat_carries_it_to_the_controller_and_the_console(
    ctl: Admin,
    tmp_path: Path,
    smi_state: Path,
) -> None:
    hwmon, powercap = sysfs(tmp_path)
    thermals = ThermalSampler(STANDIN, hwmon, powercap).sample()
    agent = FakeAgent(ctl, "hot-1")
    await agent.connect()
    serving = asyncio.create_task(agent.serve())  # answers the node page's log query, beats without thermals
    try:
        await agent.ws.send_str(dump(Heartbeat(thermals=thermals)))
        c = ctl.running.controller
        view = await wait_for(
            lambda: next((v for v in views.node_views(c) if v.name == "hot-1" and v.power_draw_watts), None),
            10,
            "the node's measured draw in the placement record",
        )
        assert view.power_draw_watts == 443.75
        (node,) = [n for n in (await ctl.get("/api/v1/nodes"))["nodes"] if n["name"] == "hot-1"]
        assert node["power_draw_watts"] == 443.75
        assert NodeThermals.model_validate(node["thermals"]) == thermals
        page = await _console_page(ctl, "/ui/nodes/hot-1")
        assert re.search(r"<dt>Draw</dt><dd>444 W", page), page
        assert "<dt>Inlet</dt><dd>24 °C" in page or "<dt>Inlet</dt><dd>25 °C" in page
        assert "sw_power_cap, hw_thermal_slowdown" in page
        assert "<td>#1</td><td>44 °C</td><td>not measured</td>" in page  # the L4's HBM: absent, not 0
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await agent.close()


async def _console_page(ctl: Admin, path: str) -> str:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(ctl.url + "/ui/login") as r:
            found = re.search(r'name="csrf" value="([^"]+)"', await r.text())
            assert found is not None
        login = {"csrf": found.group(1), "token": ctl.running.admin_token}
        async with http.post(ctl.url + "/ui/login", data=login) as r:
            assert r.status == 200
        async with http.get(ctl.url + path) as r:
            assert r.status == 200
            return await r.text()
