"""Node health: nvidia-smi's health query parsed from recorded rows, and a real agent process exporting it.

The agent runs with a stand-in nvidia-smi on PATH (tests/agent/standins/nvidia-smi: the real tool's flags, CSV
format, `[N/A]` and exit codes, values from a JSON file the test rewrites) and its metrics listener on; the
test scrapes it with prometheus-client's parser and asks it `doctor` over the wire through a fake controller.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from llmgw_agent import doctor, health
from prometheus_client.parser import text_string_to_metric_families
from support import wait_for

from .fake_controller import FakeController
from .test_daemon import AgentProcs, registered, sim_spec, start_ready, until_state

STANDINS = Path(__file__).parent / "standins"
H100 = {
    "uuid": "GPU-5e1c7a52-1b2f-4c8e-9b1e-1f2a3b4c5d6e",
    "name": "NVIDIA H100 80GB HBM3",
    "utilization.gpu": 37,
    "memory.used": 1024,
    "memory.total": 81559,
    "temperature.gpu": 41,
    "power.draw": 88.5,
    "ecc.errors.uncorrected.volatile.total": 0,
    "ecc.errors.uncorrected.aggregate.total": 3,
}
# A consumer card: no power reading, no ECC at all.
RTX = {
    "uuid": "GPU-22222222-2222-2222-2222-222222222222",
    "name": "NVIDIA GeForce RTX 4090",
    "utilization.gpu": 0,
    "memory.used": 300,
    "memory.total": 24564,
    "temperature.gpu": 30,
    "power.draw": "[N/A]",
    "ecc.errors.uncorrected.volatile.total": "[N/A]",
    "ecc.errors.uncorrected.aggregate.total": "[N/A]",
}


# ------------------------------------------------------------------------------------------------ parsing


def test_a_recorded_row_is_read_column_by_column() -> None:
    row = "0, GPU-5e1c, NVIDIA H100 80GB HBM3, 37, 1024, 81559, 41, 88.50, 0, 3\n"
    (gpu,) = health.parse_gpu_health(row)
    assert gpu.index == 0 and gpu.uuid == "GPU-5e1c" and gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.utilisation_ratio == pytest.approx(0.37)
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (1024 * 2**20, 81559 * 2**20)
    assert (gpu.temperature_celsius, gpu.power_watts) == (41.0, 88.5)
    assert (gpu.ecc_volatile, gpu.ecc_aggregate) == (0, 3)


def test_unreported_fields_are_absent_not_zero() -> None:
    row = "1, GPU-x, NVIDIA GeForce RTX 4090, 0, 300, 24564, 30, [N/A], [N/A], [Not Supported]\n"
    (gpu,) = health.parse_gpu_health(row)
    assert gpu.power_watts is None and gpu.ecc_volatile is None and gpu.ecc_aggregate is None
    assert gpu.utilisation_ratio == 0.0  # a real 0 stays 0
    names = _names(health.render(health.series_of(_sample([gpu]), version="1", node="n", engine_exits={})))
    assert "llmgw_agent_gpu_temperature_celsius" in names
    assert "llmgw_agent_gpu_power_watts" not in names
    assert "llmgw_agent_gpu_ecc_uncorrected_errors" not in names


def test_a_name_with_commas_and_a_short_row() -> None:
    (gpu,) = health.parse_gpu_health("0, GPU-y, Card, Rev 2, 5, 1, 2, 3, 4, 0, 0\n")
    assert gpu.name == "Card, Rev 2" and gpu.utilisation_ratio == pytest.approx(0.05)
    with pytest.raises(ValueError, match="expected 10"):
        health.parse_gpu_health("0, GPU-y, Card, 5\n")


def test_proc_files() -> None:
    stat = "cpu  100 5 50 1000 20 0 3 0 0 0\ncpu0 50 2 25 500 10 0 1 0 0 0\n"
    assert health.parse_proc_stat(stat, 100) == {
        "user": 1.0,
        "nice": 0.05,
        "system": 0.5,
        "idle": 10.0,
        "iowait": 0.2,
        "irq": 0.0,
        "softirq": 0.03,
        "steal": 0.0,
    }
    assert health.parse_meminfo("MemTotal:  2048 kB\nMemFree: 1 kB\nMemAvailable:  1024 kB\n") == {
        "MemTotal": 2048 * 1024,
        "MemAvailable": 1024 * 1024,
    }
    net = (
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets\n"
        "    lo: 999 9 0 0 0 0 0 0 999 9 0 0 0 0 0 0\n"
        "  eth0: 1234 10 0 0 0 0 0 0 5678 20 0 0 0 0 0 0\n"
    )
    assert health.parse_net_dev(net) == {"eth0": (1234, 5678)}


def test_the_exposition_escapes_label_values() -> None:
    sample = _sample([])
    sample.filesystems = [("models", 'C:\\odd "dir"\nx', 10, 5)]
    text = health.render(health.series_of(sample, version="1", node="n", engine_exits={}))
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "llmgw_agent_filesystem_free_bytes"
    ]
    assert family.samples[0].labels["path"] == 'C:\\odd "dir"\nx'


def _sample(gpus: list[health.GpuHealth]) -> health.Sample:
    return health.Sample(taken_at=1.7e9, gpus=gpus, smi_up=True)


def _names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


# --------------------------------------------------------------------------------- a real agent process


@pytest.fixture
def smi_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in nvidia-smi first on the agent's PATH, answering from the returned file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(STANDINS / "nvidia-smi", bin_dir / "nvidia-smi")
    state = tmp_path / "nvidia-smi.json"
    state.write_text(json.dumps({"driver_version": "550.54.15", "gpus": [H100, RTX]}))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LLMGW_NVIDIA_SMI_STATE", str(state))
    return state


def test_the_standin_answers_as_nvidia_smi_does(smi_state: Path) -> None:
    out = subprocess.run(["nvidia-smi", *health.NVIDIA_SMI_HEALTH_QUERY], capture_output=True, text=True)
    assert out.returncode == 0
    gpus = health.parse_gpu_health(out.stdout)
    assert [g.name for g in gpus] == [H100["name"], RTX["name"]] and gpus[1].power_watts is None
    # The inventory's own query (with units when nounits is not asked) is read by the same tool.
    units = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total,power.draw", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    assert units.stdout.splitlines() == ["81559 MiB, 88.50 W", "24564 MiB, [N/A]"]
    bad = subprocess.run(
        ["nvidia-smi", "--query-gpu=fan.speeed", "--format=csv"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "is not a valid field" in bad.stdout


def _answer(state: Path, what: dict[str, Any]) -> None:
    """What the stand-in nvidia-smi says from now on."""
    state.write_text(json.dumps(what))


async def _scrape(address: str) -> dict[str, list[Any]]:
    async with aiohttp.ClientSession() as s, s.get(f"http://{address}/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _value(series: dict[str, list[Any]], name: str, **labels: str) -> float | None:
    for s in series.get(name, []):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    return None


async def test_the_agent_exports_gpus_and_host_and_leaves_unknowns_out(
    ctl: FakeController, agents: AgentProcs, smi_state: Path
) -> None:
    agents.start([ctl.url], metrics_listen="127.0.0.1:0")
    await registered(ctl)
    address = ctl.registers[0].metrics_address
    assert address is not None and address.startswith("127.0.0.1:")
    m = await _scrape(address)
    assert _value(m, "llmgw_agent_info", node="node-a") == 1
    assert _value(m, "llmgw_agent_nvidia_smi_up") == 1
    assert _value(m, "llmgw_agent_gpu_temperature_celsius", gpu="0") == 41
    assert _value(m, "llmgw_agent_gpu_power_watts", gpu="0") == 88.5
    assert _value(m, "llmgw_agent_gpu_memory_used_bytes", gpu="0") == 1024 * 2**20
    assert _value(m, "llmgw_agent_gpu_utilisation_ratio", gpu="0") == pytest.approx(0.37)
    assert _value(m, "llmgw_agent_gpu_ecc_uncorrected_errors", gpu="0", scope="aggregate") == 3
    assert _value(m, "llmgw_agent_gpu_info", gpu="1", uuid=RTX["uuid"]) == 1
    # The RTX answers [N/A] for power and ECC: those series are absent, never 0.
    assert _value(m, "llmgw_agent_gpu_power_watts", gpu="1") is None
    assert _value(m, "llmgw_agent_gpu_ecc_uncorrected_errors", gpu="1", scope="volatile") is None
    # Host: CPU, memory, the agent's own filesystems by role, network counters.
    assert (_value(m, "llmgw_agent_cpu_seconds_total", mode="idle") or 0) > 0
    assert (_value(m, "llmgw_agent_memory_total_bytes") or 0) > 0
    weights = str(agents.tmp / "state" / "weights")
    assert (_value(m, "llmgw_agent_filesystem_free_bytes", role="weights", path=weights) or 0) > 0
    assert _value(m, "llmgw_agent_filesystem_size_bytes", role="models", path=str(agents.tmp / "models"))
    assert "llmgw_agent_network_receive_bytes_total" in m  # at least one interface besides lo

    # The driver breaks: nvidia-smi fails, every GPU series goes, and the failure itself is a series.
    _answer(smi_state, {"fail": "driver"})
    m = await wait_for(
        lambda: _scrape_when(address, lambda m: _value(m, "llmgw_agent_nvidia_smi_up") == 0),
        what="nvidia_smi_up 0",
    )
    assert not any(name.startswith("llmgw_agent_gpu_") for name in m)

    # Heartbeats carry the agent's clock for the controller's skew estimate.
    await wait_for(lambda: any(h.sent_at for h in ctl.heartbeats), what="a heartbeat with sent_at")


async def _scrape_when(address: str, ok: Any) -> dict[str, list[Any]] | None:
    m = await _scrape(address)
    return m if ok(m) else None


async def test_no_nvidia_smi_means_no_gpu_series_at_all(
    ctl: FakeController, agents: AgentProcs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    python_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{empty}{os.pathsep}{python_dir}")
    if shutil.which("nvidia-smi"):
        pytest.skip("a real nvidia-smi is beside the test's python")
    agents.start([ctl.url], metrics_listen="127.0.0.1:0")
    await registered(ctl)
    m = await _scrape(str(ctl.registers[0].metrics_address))
    assert "llmgw_agent_nvidia_smi_up" not in m
    assert not any(name.startswith("llmgw_agent_gpu_") for name in m)
    assert _value(m, "llmgw_agent_info", node="node-a") == 1


async def test_an_engine_exit_counts_once_from_zero(ctl: FakeController, agents: AgentProcs) -> None:
    agents.start([ctl.url], metrics_listen="127.0.0.1:0")
    await registered(ctl)
    address = str(ctl.registers[0].metrics_address)
    status = await start_ready(ctl, agents, sim_spec())
    m = await _scrape(address)
    assert _value(m, "llmgw_agent_engine_exits_total", model="sim-model", engine="sim") == 0
    assert status.pid is not None
    os.kill(status.pid, 9)
    await until_state(ctl, "rep-sim", "failed")
    m = await wait_for(
        lambda: _scrape_when(
            address, lambda m: _value(m, "llmgw_agent_engine_exits_total", model="sim-model") == 1
        ),
        what="one exit counted",
    )
    # A stop that was asked for is not an exit.
    await start_ready(ctl, agents, sim_spec(replica="rep-2"))
    assert (await ctl.command("stop_shard", replica_id="rep-2")).ok
    assert _value(await _scrape(address), "llmgw_agent_engine_exits_total", model="sim-model") == 1


# ------------------------------------------------------------------------------------ doctor, node side


async def test_doctor_on_a_healthy_node_passes(
    ctl: FakeController, agents: AgentProcs, smi_state: Path
) -> None:
    agents.start([ctl.url])
    await registered(ctl)
    reply = await ctl.command("doctor", controller_time=time.time())
    assert reply.ok, reply.error
    checks = {c["name"]: c for c in reply.payload["checks"]}
    assert {c["status"] for c in checks.values()} == {"ok"}, checks
    assert "2 GPU" in checks["driver"]["message"]
    assert checks["engine sim"]["status"] == "ok"
    assert checks["clock"]["status"] == "ok"
    assert any(name.startswith("controller 127.0.0.1:") for name in checks)


async def test_doctor_names_the_fix_for_a_broken_driver_ecc_and_a_full_disk(
    ctl: FakeController, agents: AgentProcs, smi_state: Path
) -> None:
    # Every filesystem is "full" against a threshold no disk meets.
    agents.start([ctl.url], doctor_min_free_bytes=2**62)
    await registered(ctl)
    _answer(smi_state, {"gpus": [{**H100, "ecc.errors.uncorrected.volatile.total": 2}]})
    reply = await ctl.command("doctor")
    checks = {c["name"]: c for c in reply.payload["checks"]}
    assert checks["gpu 0"]["status"] == "fail" and "nvidia-smi -r" in checks["gpu 0"]["fix"]
    assert checks["disk"]["status"] == "fail" and "weights collect" in checks["disk"]["fix"]
    assert checks["clock"]["status"] == "warn"  # no controller time sent: nothing to compare with
    assert doctor.summary([doctor.Check(**c) for c in reply.payload["checks"]]) == "fail"

    _answer(smi_state, {"fail": "driver"})
    reply = await ctl.command("doctor")
    driver = next(c for c in reply.payload["checks"] if c["name"] == "driver")
    assert driver["status"] == "fail" and "couldn't communicate with the NVIDIA driver" in driver["message"]
    assert "driver" in driver["fix"]


def test_clock_and_certificate_checks(tmp_path: Path) -> None:
    assert doctor.check_clock(1000.0, 1000.2).status == "ok"
    assert doctor.check_clock(1000.0, 998.5).status == "warn"
    skewed = doctor.check_clock(1000.0, 1030.0)
    assert skewed.status == "fail" and "30.00s behind" in skewed.message and "NTP" in skewed.fix
    assert doctor.check_certificate(None, 0).status == "ok"
    missing = doctor.check_certificate(str(tmp_path / "nope.pem"), 0)
    assert missing.status == "fail" and "bootstrap" in missing.fix
    pem = tmp_path / "node.crt"
    pem.write_bytes(_self_signed(days=10))
    now = time.time()
    assert doctor.check_certificate(str(pem), now).status == "warn"
    assert doctor.check_certificate(str(pem), now - 60 * 86400).status == "ok"
    assert doctor.check_certificate(str(pem), now + 11 * 86400).status == "fail"


def _self_signed(days: int) -> bytes:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-a")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(days=90))
        .not_valid_after(now + dt.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


async def test_a_metrics_port_already_taken_stops_the_agent_saying_so(
    ctl: FakeController, agents: AgentProcs
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = agents.start([ctl.url], metrics_listen=f"127.0.0.1:{port}")
        await wait_for(lambda: proc.poll() is not None, 60, "the agent to exit")
    assert proc.returncode != 0
    logged = (agents.tmp / "agent-0.log").read_text()
    assert f"metrics_listen 127.0.0.1:{port}" in logged and "address already in use" in logged.lower()
    assert ctl.registers == []  # it never registered half-seen


async def test_doctor_runs_each_installed_engines_probe_now(
    ctl: FakeController, agents: AgentProcs, tmp_path: Path
) -> None:
    # An engine that passed its probe at start and breaks later (a driver update took its library away).
    broken = tmp_path / "broken"
    engine = tmp_path / "llama-server"
    engine.write_text(
        f'#!/bin/sh\nif [ -e "{broken}" ]; then\n'
        '  echo "llama-server: error while loading shared libraries: libcuda.so.1" >&2; exit 127\nfi\n'
        'echo "version: 4410 (b11434)"\n'
    )
    engine.chmod(0o755)
    agents.start([ctl.url], engines={"llamacpp": {"path": str(engine), "version": "b11434"}})
    await registered(ctl)
    reply = await ctl.command("doctor", controller_time=time.time())
    checks = {c["name"]: c for c in reply.payload["checks"]}
    assert checks["engine llamacpp"]["status"] == "ok" and "b11434" in checks["engine llamacpp"]["message"]
    broken.touch()
    reply = await ctl.command("doctor", controller_time=time.time())
    failed = next(c for c in reply.payload["checks"] if c["name"] == "engine llamacpp")
    assert failed["status"] == "fail" and "libcuda.so.1" in failed["message"]
    assert "engines.llamacpp" in failed["fix"]
