"""Every command's LlmgwError ends at one edge (llmgw.cli.main.Commands): `error: MESSAGE` on stderr, exit 1."""

from __future__ import annotations

from pathlib import Path

import typer
from support import free_port
from typer.testing import CliRunner

from llmgw.cli.admin_client import AdminError
from llmgw.cli.main import Commands, app
from llmgw.core.errors import ConfigInvalidError


def test_an_error_a_command_does_not_handle_is_one_line_and_exit_1() -> None:
    probe = typer.Typer(cls=Commands)
    probe.callback()(lambda: None)

    @probe.command()
    def down() -> None:
        raise AdminError("the controller at http://x is not answering; is it running? [try --controller]")

    @probe.command()
    def invalid() -> None:
        raise ConfigInvalidError(
            ["models/a.yaml:3:1: spec.bogus: not a field", "cluster.yaml:1:1: kind: missing"]
        )

    result = CliRunner().invoke(probe, ["down"])
    assert result.exit_code == 1
    assert (
        result.stderr
        == "error: the controller at http://x is not answering; is it running? [try --controller]\n"
    )
    result = CliRunner().invoke(probe, ["invalid"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: 2 error(s) in the cluster repo",
        "  models/a.yaml:3:1: spec.bogus: not a field",
        "  cluster.yaml:1:1: kind: missing",
    ]


def test_a_controller_that_is_not_there_is_said_by_the_edge(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0ken\n")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = CliRunner().invoke(app, ["status", "--controller", url, "--token-file", str(tmp_path / "token")])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: ") and url in result.stderr
    assert "Traceback" not in result.output + result.stderr
