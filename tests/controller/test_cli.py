"""`llmgw controller` as a real process, and the views (`status`, `nodes`, `replicas`, `models`, `explain`)
against it through the CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import free_port, wait_until
from typer.testing import CliRunner

from llmgw.cli.main import app

from .helpers import Agents, Repo, cluster_yaml, model_yaml

pytestmark = pytest.mark.integration


class Cli:
    def __init__(self, url: str, token_file: Path) -> None:
        self.runner = CliRunner()
        self.base = ["--controller", url, "--token-file", str(token_file)]

    def run(self, *args: str) -> str:
        result = self.runner.invoke(app, [*args, *self.base])
        assert result.exit_code == 0, result.output
        return result.output

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json"))


@pytest.fixture
def controller_proc(tmp_path: Path) -> Iterator[tuple[str, Path, Repo, Agents, subprocess.Popen[bytes]]]:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=1)})
    token = tmp_path / "token"
    token.write_text("cli-token\n")
    port = free_port()
    log = (tmp_path / "controller.log").open("wb")
    cmd = [
        sys.executable,
        "-c",
        "from llmgw.cli.main import main; main()",
        "controller",
        "--repo",
        str(repo.path),
        "--store",
        f"sqlite:///{tmp_path / 'c.db'}",
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-listen",
        "127.0.0.1:0",
        "--admin-token-file",
        str(token),
        "--state-dir",
        str(tmp_path / "state"),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    agents = Agents(tmp_path, token)
    try:
        yield f"http://127.0.0.1:{port}", token, repo, agents, proc
    finally:
        agents.cleanup()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_views_of_a_running_controller(controller_proc: Any) -> None:
    url, token, repo, agents, _ = controller_proc
    cli = Cli(url, token)

    def reachable() -> bool:
        result = cli.runner.invoke(app, ["status", "--json", *cli.base])
        return result.exit_code == 0

    wait_until(reachable, 30, "the controller answering", interval=0.1)
    agents.start("n1", url.removeprefix("http://"))

    def healthy() -> Any:
        status = cli.json("status")
        return status if status["models"] and status["models"][0]["health"] == "Healthy" else None

    status = wait_until(healthy, 60, "sim-a Healthy", interval=0.1)
    assert status["sync"] == "Synced"
    text = cli.run("status")
    assert "sim-a" in text and "Healthy" in text and "Synced" in text

    # n1 is not declared in the repo: status, nodes and plan say the controller leaves it as it is.
    said = " ".join(text.split())
    assert "undeclared n1: not declared in the repo, left as it is: its 1 replica keeps running" in said
    table = cli.run("nodes")
    assert "AGENT" in table
    row = next(line for line in table.splitlines() if "n1" in line)
    assert "Ready" in row.split() and "0.1.0" in row.split(), table  # the agent's version, in its own column
    listed = cli.json("nodes")["nodes"]
    assert [(n["name"], n["declared"], n["if_undeclared"]) for n in listed] == [("n1", False, "keep")]
    result = cli.runner.invoke(app, ["plan", str(repo.path), "--detailed-exitcode", *cli.base])
    planned = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "= keep n1: not declared in the repo" in planned and "drain n1" not in planned
    assert "No changes. 1 node not declared in the repo left as it is." in planned
    replicas = cli.json("replicas")["replicas"]
    assert len(replicas) == 1 and replicas[0]["state"] == "ready" and replicas[0]["node"] == "n1"
    assert replicas[0]["id"] in cli.run("replicas")
    assert "sim-a" in cli.run("models")

    explained = cli.json("explain", "sim-a")
    assert explained["would_place"]["nodes"] == ["n1"]
    assert "fits" in cli.run("explain", "sim-a")

    result = cli.runner.invoke(app, ["explain", "nope", *cli.base])
    assert result.exit_code == 1 and "not in the applied revision" in result.output
    wrong = token.parent / "wrong-token"
    wrong.write_text("not-the-token\n")
    result = CliRunner().invoke(app, ["status", "--controller", url, "--token-file", str(wrong)])
    assert result.exit_code == 1 and "refused the admin token" in result.output


def test_controller_stops_cleanly_on_sigterm(tmp_path: Path, controller_proc: Any) -> None:
    url, token, _, _, proc = controller_proc
    cli = Cli(url, token)
    wait_until(
        lambda: cli.runner.invoke(app, ["status", "--json", *cli.base]).exit_code == 0,
        30,
        "the controller up",
        interval=0.1,
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert "Traceback" not in (tmp_path / "controller.log").read_text()
