"""M6: the agent and its engines run as the unprivileged `llmgw` account inside a systemd sandbox.

systemd cannot run here, so the units bootstrap writes are held by golden files and checked with
`systemd-analyze verify` (Debian's `systemd` package ships it; it needs no running systemd). The sshd bootstrap
test (tests/nodes/test_bootstrap_ssh.py) shows the process-mode agent running as `llmgw` after a root login.

Regenerate the golden files after an intended change with `LLMGW_UPDATE_GOLDEN=1 pytest tests/security`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw.adapters.ssh import render

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LLMGW_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with LLMGW_UPDATE_GOLDEN=1 once and read it"
    assert text == path.read_text()


def directives(unit: bytes) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.decode().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "[")):
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("gpus", [False, True], ids=["cpu", "gpu"])
def test_m6_unit_runs_the_agent_unprivileged_and_sandboxed(gpus: bool) -> None:
    layout = render.Layout()
    unit = render.systemd_unit(layout, "node-a", gpus=gpus)
    golden(f"llmgw-agent-{'gpu' if gpus else 'cpu'}.service", unit.decode())
    d = directives(unit)
    assert d["User"] == ["llmgw"] and d["Group"] == ["llmgw"]
    assert d["NoNewPrivileges"] == ["yes"] and d["ProtectSystem"] == ["strict"]
    assert d["ProtectHome"] == ["yes"] and d["PrivateTmp"] == ["yes"]
    assert d["CapabilityBoundingSet"] == [""]
    # Writable: the state (work dirs, shard records) and the weights cache; nothing else, not the venv.
    assert d["ReadWritePaths"] == [f"{layout.state} {layout.weights}"]
    if gpus:
        assert d["DevicePolicy"] == ["closed"] and "PrivateDevices" not in d
        assert all(a.startswith("char-nvidia") for a in d["DeviceAllow"])
    else:
        assert d["PrivateDevices"] == ["yes"] and "DeviceAllow" not in d


@pytest.mark.parametrize("gpus", [False, True], ids=["cpu", "gpu"])
def test_m6_units_pass_systemd_analyze_verify(gpus: bool, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        message = (
            "systemd-analyze not installed (Debian: apt-get install systemd; scripts/install-system-deps.sh)"
        )
        if os.environ.get("CI") or os.environ.get("LLMGW_REQUIRE_TOOLS"):
            pytest.fail(message)
        pytest.skip(message)
    # verify checks that ExecStart= is executable, so the prefix is a real one holding an agent executable.
    layout = render.Layout(prefix=str(tmp_path / "opt-llmgw"))
    Path(layout.agent_bin).parent.mkdir(parents=True)
    Path(layout.agent_bin).write_text("#!/bin/sh\n")
    Path(layout.agent_bin).chmod(0o755)
    unit = tmp_path / f"{layout.unit_name}.service"
    unit.write_bytes(render.systemd_unit(layout, "node-a", gpus=gpus))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # Unknown or misspelled directives are only warnings to verify: any output at all is a failure here.
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stderr


def test_m6_verify_would_catch_a_misspelt_directive(tmp_path: Path) -> None:
    """The verify test above is not vacuous: a directive systemd does not know is reported."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    unit = tmp_path / "broken.service"
    unit.write_text("[Service]\nExecStart=/bin/true\nProtectSystm=strict\n")
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "ProtectSystm" in proc.stderr


def test_m6_bootstrap_as_root_starts_the_agent_as_llmgw() -> None:
    layout = render.Layout()
    as_root = render.start_supervisor_command(layout, as_agent_user=True)
    assert "setpriv --reuid=llmgw --regid=llmgw --init-groups --reset-env -- " in as_root
    assert "setpriv" not in render.start_supervisor_command(layout)  # a non-root login runs as itself
    account = render.account_command(layout)
    assert "useradd --system" in account
    # It owns its config, state and weights; the venv, scripts, pid file and log stay root's (it cannot
    # rewrite its own code).
    chown = next(line for line in account.splitlines() if "chown -R" in line)
    assert chown.split() == [
        "chown",
        "-R",
        "llmgw:llmgw",
        layout.etc,
        layout.state,
        layout.weights,
        "||",
        "exit",
        "1",
    ]


def test_m6_root_bootstrap_picks_a_python_the_llmgw_account_can_run() -> None:
    from llmgw.adapters.ssh.bootstrap import parse_probe
    from llmgw.adapters.ssh.remote import StepFailed

    probe = "uid={uid}\npython=3.11.7 /root/.pyenv/shims/python3\npython_private=/root/.pyenv/shims/python3\n"
    system = "python=3.11.2 /usr/bin/python3\n"
    assert parse_probe(probe.format(uid=0) + system, (3, 11)).python == "/usr/bin/python3"
    # A non-root login runs the agent as itself: its own python is fine.
    assert parse_probe(probe.format(uid=1000) + system, (3, 11)).python == "/root/.pyenv/shims/python3"
    with pytest.raises(StepFailed, match="only in directories the llmgw account may not enter"):
        parse_probe(probe.format(uid=0), (3, 11))
