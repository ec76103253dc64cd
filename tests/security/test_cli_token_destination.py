"""L5: `plan`, `apply` and `status` send the admin token only where the user said, never to the address a
cluster repo (a pull request) declares, and never over plain http to another machine without saying so.

The "controller" the repo declares is a real HTTP server on loopback that records what it receives: before
the fix it received the token from $LLMGW_TOKEN.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from controller.helpers import cluster_yaml, model_yaml
from typer.testing import CliRunner

from llmgw.cli import admin_client
from llmgw.cli.admin_client import AdminError, Token
from llmgw.cli.main import app

SECRET = "pr-job-token-value"


class Trap:
    """An HTTP server that answers nothing useful and keeps every Authorization header it is sent."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.address = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"error": {"message": "trap"}}, status=500)


@pytest.fixture
async def trap() -> AsyncIterator[Trap]:
    t = Trap()
    server = web.Application()
    server.router.add_route("*", "/{tail:.*}", t.handle)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    t.address = f"127.0.0.1:{port}"
    try:
        yield t
    finally:
        await runner.cleanup()


def _repo_declaring(tmp: Path, address: str) -> Path:
    repo = tmp / "repo"
    (repo / "models").mkdir(parents=True)
    cluster = cluster_yaml().replace("  controller:\n", f"  controller:\n    address: {address}\n")
    (repo / "cluster.yaml").write_text(cluster)
    (repo / "models" / "a.yaml").write_text(model_yaml("sim-a", min_=0))
    return repo


async def _invoke(*words: str, env: dict[str, str | None]) -> tuple[int, str]:
    runner = CliRunner(env={"COLUMNS": "300", **env})
    result = await asyncio.to_thread(runner.invoke, app, list(words))
    return result.exit_code, result.output


@pytest.mark.parametrize("command", ["plan", "apply"])
async def test_l5_env_token_is_not_sent_to_the_repo_declared_address(
    tmp_path: Path, trap: Trap, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo_declaring(tmp_path, trap.address)
    monkeypatch.chdir(tmp_path)
    code, output = await _invoke(command, str(repo), env={"LLMGW_TOKEN": SECRET, "LLMGW_CONTROLLER": None})
    assert code == 1, output
    assert "--controller URL or set LLMGW_CONTROLLER" in output and "$LLMGW_TOKEN" in output
    assert trap.seen == [], "the token went to the address the cluster repo declares"
    assert SECRET not in output


async def test_l5_token_file_is_not_sent_to_the_repo_declared_address(tmp_path: Path, trap: Trap) -> None:
    repo = _repo_declaring(tmp_path, trap.address)
    token = tmp_path / "token"
    token.write_text(SECRET)
    code, output = await _invoke(
        "plan", str(repo), "--token-file", str(token), env={"LLMGW_CONTROLLER": None}
    )
    assert code == 1 and f"--token-file {token}" in output
    assert trap.seen == []


async def test_l5_an_explicit_controller_gets_the_token(tmp_path: Path, trap: Trap) -> None:
    """The same token, named destination: it goes there (the trap answers 500, so the command fails after)."""
    repo = _repo_declaring(tmp_path, "127.0.0.1:9")
    code, _ = await _invoke(
        "plan", str(repo), env={"LLMGW_TOKEN": SECRET, "LLMGW_CONTROLLER": f"http://{trap.address}"}
    )
    assert code == 1
    assert trap.seen and trap.seen[0] == f"Bearer {SECRET}"


def test_l5_a_local_controllers_own_token_may_use_a_loopback_declared_address() -> None:
    choose_controller = admin_client.choose_controller
    local = Token("t", "/x/.llmgw/controller/admin-token", explicit=False)
    assert choose_controller(None, "127.0.0.1:7070", local) == "127.0.0.1:7070"
    with pytest.raises(AdminError, match="used only when it is on this machine"):
        choose_controller(None, "controller.example.invalid:7070", local)
    flag = Token("t", "--token-file t")
    with pytest.raises(AdminError, match="sent only to a controller named explicitly"):
        choose_controller(None, "127.0.0.1:7070", flag)
    assert (
        choose_controller("https://ctl.example.invalid", "127.0.0.1:7070", flag)
        == "https://ctl.example.invalid"
    )


def test_l5_no_silent_http_for_a_host_that_is_not_loopback() -> None:
    controller_url, plaintext_warning = admin_client.controller_url, admin_client.plaintext_warning
    with pytest.raises(AdminError, match=r"has no scheme: write https://ctl\.example\.invalid:7070"):
        controller_url("ctl.example.invalid:7070")
    assert controller_url("127.0.0.1:7070") == "http://127.0.0.1:7070"
    assert controller_url("[::1]:7070") == "http://[::1]:7070"
    warning = plaintext_warning("http://ctl.example.invalid:7070")
    assert warning is not None and "plain http" in warning
    assert plaintext_warning("https://ctl.example.invalid:7070") is None
    assert plaintext_warning("http://127.0.0.1:7070") is None


def test_l5_status_with_a_bare_remote_host_fails_before_any_connection(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(SECRET)
    result = CliRunner(env={"COLUMNS": "300"}).invoke(
        app, ["status", "--controller", "ctl.example.invalid:7070", "--token-file", str(token)]
    )
    assert result.exit_code == 1 and "has no scheme" in result.output
