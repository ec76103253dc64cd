"""The store commands find the deployment's store (issue 39): `llmgw usage`, `traffic export|import` and `store
...` open the store the controller's configuration or its admin API names, say which one chose it, and never
make an empty SQLite store where none is: a missing store is an error saying where it looked and how to point
at the right one. On a PostgreSQL deployment that empty file read as "no usage" and as a trace of no
requests, which `plan --simulate --trace` replayed as zero requests and passed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from controller.helpers import Admin, Repo, cluster_yaml, settings_for, start
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.controller.app import RunningController
from llmgw.store import Store, UsageRecord

runner = CliRunner(env={"COLUMNS": "200"})


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def _seed(dsn: str, requests: int) -> None:
    async def go() -> None:
        store = await Store.open(dsn)
        try:
            now = time.time()
            await store.insert_usage(
                [
                    UsageRecord(
                        time=now - i, request_id=f"r{i}", project="web", model="m", status=200, tokens_in=3
                    )
                    for i in range(requests)
                ]
            )
        finally:
            await store.close()

    asyncio.run(go())


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no store in it, and nothing in the environment naming one."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for name in ("LLMGW_STORE", "LLMGW_CONTROLLER", "LLMGW_CONTROLLER_CONFIG", "LLMGW_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return cwd


def test_no_store_anywhere_is_an_error_that_says_where_it_looked_and_makes_nothing(elsewhere: Path) -> None:
    for args in (["usage"], ["traffic", "export", "--since", "1h"], ["store", "migrate"]):
        code, out, err = invoke(*args)
        assert code == 1 and out == "", (args, out)
        assert "no store found" in err and str(elsewhere / ".llmgw" / "state" / "llmgw.db") in err, err
        assert "--controller-config" in err and "--store" in err, err
    missing = elsewhere / "typo.db"
    code, _, err = invoke("usage", "--store", f"sqlite:///{missing}")
    assert code == 1 and f"no store at {missing} (chosen by --store)" in err, err
    assert not (elsewhere / ".llmgw").exists() and not missing.exists(), "an empty store was made"


def test_the_controllers_configuration_names_the_store_and_the_command_says_so(
    elsewhere: Path, tmp_path: Path, store_dsn: str
) -> None:
    _seed(store_dsn, 3)
    config = tmp_path / "controller.yaml"
    config.write_text(json.dumps({"repo": str(tmp_path / "repo"), "store": store_dsn}))
    code, out, err = invoke("usage", "--by", "project", "--json", "--controller-config", str(config))
    assert code == 0, err
    assert [(r["project"], r["requests"]) for r in json.loads(out)] == [("web", 3)]
    assert f"(chosen by the controller's configuration {config})" in err, err
    code, out, err = invoke(
        "traffic", "export", "--since", "1h", env={"LLMGW_CONTROLLER_CONFIG": str(config)}
    )
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1 + 3  # the header, then the three requests


@pytest.fixture
async def controller(tmp_path: Path, store_dsn: str) -> AsyncIterator[tuple[RunningController, Admin]]:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    running, admin = await start(settings_for(tmp_path, repo.path, store=store_dsn))
    try:
        yield running, admin
    finally:
        await running.stop()


async def test_the_controllers_admin_api_names_its_store(
    elsewhere: Path, tmp_path: Path, store_dsn: str, controller: tuple[RunningController, Admin]
) -> None:
    running, admin = controller
    await asyncio.to_thread(_seed, store_dsn, 2)
    told = await admin.get("/api/v1/store")
    assert "password" not in json.dumps(told)
    env = {"LLMGW_CONTROLLER": running.url, "LLMGW_TOKEN": running.admin_token}
    code, out, err = await asyncio.to_thread(invoke, "usage", "--by", "model", "--json", env=env)
    assert code == 0, err
    assert [(r["model"], r["requests"]) for r in json.loads(out)] == [("m", 2)]
    assert f"(chosen by the controller at {running.url} (its admin API))" in err, err
