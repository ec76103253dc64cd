"""What `llmgw server init` writes, checked without a machine: the units pass `systemd-analyze verify` and hold
the sandbox, the settings files are read by the controller's and the router's own parsers, the starter repo
validates, and the steps refuse a machine they cannot install on, saying why.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from llmgw_router.main import parse_args

from llmgw.adapters.repo_files import load_repo
from llmgw.adapters.server import layout as L, starter
from llmgw.adapters.server.init import Init
from llmgw.adapters.server.machine import Machine
from llmgw.adapters.server.options import InitOptions
from llmgw.adapters.server.services import _password
from llmgw.cli.fleet.controller_cmds import controller_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"


def _settings(
    bin_dir: str = "/opt/llmgw/venv/bin", environment: dict[str, str] | None = None
) -> L.ServerSettings:
    return L.ServerSettings(
        repo="/var/lib/llmgw/repo",
        bin_dir=bin_dir,
        router_name="s1",
        advertise="10.0.0.5",
        environment=environment or {},
    )


def _directives(unit: bytes) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.decode().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("["):
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("service", ["controller", "router", "agent"])
def test_units_hold_the_sandbox_and_run_the_installed_commands(service: str) -> None:
    lay = L.ServerLayout()
    d = _directives(L.unit(lay, _settings(environment={"OTEL_X": "1"}), service))
    assert d["User"] == ["llmgw"] and d["Group"] == ["llmgw"]
    assert (
        d["NoNewPrivileges"] == ["yes"] and d["ProtectSystem"] == ["strict"] and d["ProtectHome"] == ["yes"]
    )
    assert d["CapabilityBoundingSet"] == [""] and d["PrivateTmp"] == ["yes"]
    assert "Environment" in d and "OTEL_X=1" in d["Environment"]
    assert shlex.split(d["ExecStart"][0]) == L.exec_argv(lay, _settings(), service)
    if service == "controller":
        assert d["ReadWritePaths"] == ["/var/lib/llmgw/controller /var/lib/llmgw/repo"]
        assert d["LimitNOFILE"] == ["65536"]
    if service == "router":
        assert d["ReadWritePaths"] == ["/var/lib/llmgw/router"]
        assert d["InaccessiblePaths"] == ["-/var/lib/llmgw/controller"]  # the CA's key is not the router's
    # An interpreter installed under a home directory stays reachable: read-only, not hidden.
    home = _directives(L.unit(lay, _settings("/root/venv/bin"), service))
    assert home["ProtectHome"] == ["read-only"]


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI") or os.environ.get("LLMGW_REQUIRE_TOOLS"):
            pytest.fail("systemd-analyze not installed (scripts/install-system-deps.sh)")
        pytest.skip("systemd-analyze not installed")
    bin_dir = tmp_path / "bin"  # verify checks that ExecStart= is executable
    bin_dir.mkdir()
    for name in ("llmgw", "llmgw-router", "llmgw-agent"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    for service in ("controller", "router", "agent"):
        unit = tmp_path / f"llmgw-{service}.service"
        unit.write_bytes(L.unit(L.ServerLayout(), _settings(str(bin_dir)), service))
        proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), proc.stderr


def test_settings_files_are_read_by_the_services_own_parsers(tmp_path: Path) -> None:
    lay, s = L.ServerLayout(), _settings()
    controller = tmp_path / "controller.yaml"
    controller.write_bytes(L.controller_config(lay, s))
    opts = controller_settings(controller, {}, None)
    assert opts.listen == "0.0.0.0:7070" and opts.store == "@/etc/llmgw/secrets/store.dsn"
    assert opts.ca_dir == Path(lay.ca_dir) and opts.state_dir == Path(lay.controller_state)
    router = tmp_path / "router.yaml"
    router.write_bytes(L.router_config(lay, s))
    ns = parse_args(["--config", str(router)])
    assert ns.controller == ["https://10.0.0.5:7070"] and ns.listen == "0.0.0.0:8443"
    assert (ns.tls_cert, ns.tls_key) == (lay.server_cert, lay.server_key)
    assert (ns.controller_cert, ns.token_file) == (lay.router_client_cert, lay.router_token)
    assert L.controller_config(lay, s) == L.controller_config(
        lay, s
    )  # deterministic: a second init writes nothing


@pytest.mark.parametrize("node", [None, "gpu-1"])
def test_starter_repo_validates_and_names_this_machine(tmp_path: Path, node: str | None) -> None:
    target = tmp_path / "repo"
    starter.write(EXAMPLE, target, _settings(), node=node)
    loaded = load_repo(target)
    assert loaded.catalog is not None, loaded.errors
    assert loaded.catalog.cluster.controller.address == "10.0.0.5:7070"
    assert sorted(loaded.catalog.nodes) == ([] if node is None else [node])
    assert "# " in (target / "cluster.yaml").read_text()  # the example's comments kept for the operator


def test_kept_store_password_is_read_back() -> None:
    assert _password("postgresql://llmgw:s3cr-et_@127.0.0.1:5432/llmgw\n") == "s3cr-et_"
    assert _password("postgresql://llmgw@127.0.0.1/llmgw") is None
    assert _password(None) is None


def test_check_refuses_a_machine_that_is_not_debian(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_text('ID=fedora\nPRETTY_NAME="Fedora Linux 40"\n')
    run = Init(Machine(tmp_path), InitOptions(bin_dir="/nowhere", dry_run=True))
    result = asyncio.run(run.run())
    first = result.steps[0]
    assert (first.name, first.status) == ("check", "failed")
    assert "installs on Debian or Ubuntu; this machine runs Fedora Linux 40" in first.detail
    assert all(s.status == "skipped" for s in result.steps[1:])


def test_check_names_the_missing_executables(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_text('ID=debian\nPRETTY_NAME="Debian GNU/Linux 12"\n')
    result = asyncio.run(Init(Machine(tmp_path), InitOptions(bin_dir="/opt/x/bin", dry_run=True)).run())
    assert "llmgw, llmgw-router not found in /opt/x/bin: give --bin-dir" in result.steps[0].detail
