"""`llmgw doctor [NODE]` against a running controller with real agent processes: the controller side passes
with the warning it should (no router), a healthy node passes, a node whose weights disk is under its threshold
or whose nvidia-smi fails (the stand-in tests/agent/standins/nvidia-smi) fails with the fix named and exit 1.
The same controller measures each node's clock offset on heartbeats, exports it, and lists an agent's
node-health listener for Prometheus http_sd."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from support import wait_for
from typer.testing import CliRunner

from llmgw.cli.main import app as cli_app
from llmgw.core.fleet import health

from .helpers import Agents, Repo, cluster_yaml, settings_for, start

pytestmark = pytest.mark.integration
STANDIN = Path(__file__).parents[1] / "agent" / "standins" / "nvidia-smi"


def _doctor(url: str, *args: str) -> Any:
    # CliRunner runs the command in this thread; the test's event loop runs the controller.
    return CliRunner().invoke(
        cli_app, ["doctor", *args, "--controller", url], env={"LLMGW_TOKEN": "test-token"}
    )


async def _connected(admin: Any, *nodes: str) -> bool:
    listed = {n["name"]: n for n in (await admin.get("/api/v1/nodes"))["nodes"]}
    return all(listed.get(n, {}).get("state") == "Ready" for n in nodes)


async def test_doctor_checks_the_controller_and_each_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(STANDIN, bin_dir / "nvidia-smi")
    smi = tmp_path / "nvidia-smi.json"
    smi.write_text(json.dumps({"gpus": [{"uuid": "GPU-a", "name": "NVIDIA L4", "memory.total": 23034}]}))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LLMGW_NVIDIA_SMI_STATE", str(smi))

    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(unreachable="10s", lost="60s")})
    running, admin = await start(settings_for(tmp_path, repo.path))
    agents = Agents(tmp_path, tmp_path / "token")
    try:
        address = running.url.removeprefix("http://")
        agents.start("healthy", address, extra={"metrics_listen": "127.0.0.1:0"})
        agents.start("full", address, extra={"doctor_min_free_bytes": 2**62})
        await wait_for(lambda: _connected(admin, "healthy", "full"), 60, "both agents Ready")

        # The controller side: the store and the repo are fine; no router is subscribed (a warning: exit 0).
        result = await asyncio.to_thread(_doctor, running.url, "--json")
        assert result.exit_code == 0, result.output
        checks = {c["name"]: c for c in json.loads(result.output)["checks"]}
        assert checks["store"]["status"] == "ok" and checks["repo"]["status"] == "ok"
        assert checks["agents"]["status"] == "ok" and "2 agent(s)" in checks["agents"]["message"]
        assert checks["routers"]["status"] == "warn" and "--controller" in checks["routers"]["fix"]
        text = (await asyncio.to_thread(_doctor, running.url)).output
        assert "warn routers" in " ".join(text.split()) and "fix:" in text

        # A healthy node: every check ok, its clock measured on heartbeats.
        await wait_for(
            lambda: running.controller.hub.nodes["healthy"].clock_offset is not None, what="a clock reading"
        )
        result = await asyncio.to_thread(_doctor, running.url, "healthy", "--json")
        assert result.exit_code == 0, result.output
        answer = json.loads(result.output)
        assert answer["status"] == "ok", answer
        names = {c["name"] for c in answer["checks"]}
        assert {"driver", "engine sim", "disk", "clock", "clock (heartbeats)", "certificates"} <= names

        # A node whose weights disk is under its threshold: fail, exit 1, the fix named.
        result = await asyncio.to_thread(_doctor, running.url, "full")
        assert result.exit_code == 1, result.output
        said = " ".join(result.output.split())
        assert "fail disk: weights filesystem nearly full" in said and "llmgw weights collect" in said

        # The driver stops answering on every node: the healthy one fails too, on the driver.
        smi.write_text(json.dumps({"fail": "driver"}))
        result = await asyncio.to_thread(_doctor, running.url, "healthy", "--json")
        assert result.exit_code == 1
        driver = next(c for c in json.loads(result.output)["checks"] if c["name"] == "driver")
        assert driver["status"] == "fail" and "reload the driver or reboot" in driver["fix"]

        result = await asyncio.to_thread(_doctor, running.url, "nobody")
        assert result.exit_code == 1 and "node nobody is unknown" in " ".join(result.output.split())

        # The clock offset is exported, and the agent with a listener is an http_sd target.
        metrics = await admin.metrics()
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith('llmgw_controller_node_clock_offset_seconds{node="healthy"}')
        )
        assert abs(float(line.split()[-1])) < health.CLOCK_FAIL_S
        groups = await admin.get("/api/v1/prometheus/targets")
        agent_groups = [g for g in groups if g["labels"]["llmgw_component"] == "agent"]
        assert [g["labels"]["llmgw_node"] for g in agent_groups] == ["healthy"]
        assert agent_groups[0]["targets"][0].startswith("127.0.0.1:")
    finally:
        agents.cleanup()
        await running.stop()


def test_the_clock_offset_is_the_fastest_heartbeats() -> None:
    # Node 2s ahead; transits of 0.5s, 0.01s and 3s make it look 1.5s, 1.99s and -1s ahead: 1.99 is best.
    assert health.clock_offset([1.5, 1.99, -1.0]) == 1.99
    assert health.clock_offset([]) is None
    assert health.clock_check("n", None).status == "warn"
    assert health.clock_check("n", -0.3).status == "ok"
    assert health.clock_check("n", -6.0).status == "fail"


def test_certificate_and_source_rules() -> None:
    day = 86400.0
    assert health.certificate_check("ca.crt", 100 * day, None, 0).status == "ok"
    assert health.certificate_check("ca.crt", 10 * day, None, 0).status == "warn"
    assert health.certificate_check("ca.crt", 10 * day, None, 11 * day).status == "fail"
    assert health.certificate_check("x", None, "x: no such file", 0).status == "fail"
    assert health.source_check("git fetch failed", "abc", None, ()).status == "fail"
    assert health.source_check(None, None, None, ()).status == "fail"
    refused = health.source_check(None, "abc", "def", ("m.yaml:1:1: bad",))
    assert refused.status == "warn" and "m.yaml:1:1" in refused.message
    assert health.worst([health.Check("a", "ok", ""), health.Check("b", "warn", "")]) == "warn"


def test_a_certificate_files_expiry_or_why_it_cannot_be_read(tmp_path: Path) -> None:
    from llmgw.adapters.cert_files import not_after
    from llmgw.adapters.ssh.ca import ClusterCA

    ca = ClusterCA.open(tmp_path / "ca")
    expiry, error = not_after(ca.cert_path)
    assert error is None and expiry is not None
    check = health.certificate_check("cluster CA ca.crt", expiry, error, time.time())
    assert check.status == "ok" and "valid until" in check.message
    garbage = tmp_path / "bad.crt"
    garbage.write_text("not a certificate\n")
    assert not_after(garbage)[1] is not None and "not a PEM certificate" in str(not_after(garbage)[1])
    missing = not_after(tmp_path / "nope.crt")
    assert missing[0] is None and "nope.crt" in str(missing[1])


def test_llmgw_nodes_says_a_skewed_clock_and_nothing_for_a_good_one() -> None:
    from llmgw.cli.fleet.controller_cmds import clock_lines

    assert clock_lines({"name": "gpu-1", "clock_offset_s": -7.5}) == [
        "clock 7.5s behind the controller's: fix NTP (`llmgw doctor gpu-1`)"
    ]
    assert clock_lines({"name": "gpu-1", "clock_offset_s": 0.004}) == []
    assert clock_lines({"name": "gpu-1", "clock_offset_s": None}) == []
