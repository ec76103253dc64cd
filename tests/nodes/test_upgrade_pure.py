"""The upgrade's decisions without a node: which nodes go in which batch, what a request may say, when an
agent counts as back, and the shell that switches the venv (run against a real directory)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from llmgw_agent.protocol import Inventory, ShardStatus

from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.upgrade import switch_command
from llmgw.cli.deploy.upgrade_cmds import print_answer
from llmgw.controller.api.upgrades import (
    NOT_MANAGED,
    UpgradeRequest,
    back_problem,
    parse_request,
    upgrade_order,
)
from llmgw.controller.parts.hub import NodeLink


def test_order_batches_managed_nodes_by_name_and_names_the_rest() -> None:
    order = upgrade_order(None, managed={"c", "a", "b"}, known={"a", "b", "c", "local"}, parallel=2)
    assert order.batches == (("a", "b"), ("c",))
    assert (order.not_managed, order.unknown) == (("local",), ())
    asked = upgrade_order(["b", "ghost", "local"], managed={"a", "b"}, known={"a", "b", "local"}, parallel=1)
    assert (asked.batches, asked.not_managed, asked.unknown) == ((("b",),), ("local",), ("ghost",))


def test_a_request_says_what_is_wrong_with_it() -> None:
    assert parse_request({}) == UpgradeRequest(None, 1, None, None)
    assert parse_request(
        {"nodes": ["a"], "parallel": 3, "wheelhouse": "/w", "timeout_s": 30}
    ) == UpgradeRequest(["a"], 3, Path("/w"), 30)
    assert "parallel must be a whole number" in str(parse_request({"parallel": 0}))
    assert "parallel must be a whole number" in str(parse_request({"parallel": True}))
    assert "absolute directory" in str(parse_request({"wheelhouse": "relative/dir"}))
    assert "unknown field(s) node " in str(parse_request({"node": "a"}))
    assert "timeout_s must be" in str(parse_request({"timeout_s": -1}))
    assert "JSON object" in str(parse_request(["a"]))


def _link(version: str, connected_at: float, shards: dict[str, int]) -> NodeLink:
    link = NodeLink("n", Inventory(), version, "127.0.0.1", connected_at, connected_at)
    link.shards = {
        f"{rid}-0": ShardStatus(replica_id=rid, model="m", engine="sim", state="ready", pid=pid)
        for rid, pid in shards.items()
    }
    return link


class _OpenSocket:
    closed = False


def test_an_agent_is_back_only_registered_again_on_the_version_with_its_engines_under_their_pids() -> None:
    engines = {"r1-0": 100, "r2-0": 200}
    reported = {"r1": 100, "r2": 200}
    assert back_problem(None, 10.0, "0.2", engines) == "it has not registered again"
    stale = _link("0.1", 5.0, reported)
    stale.ws = _OpenSocket()  # type: ignore[assignment]
    assert back_problem(stale, 10.0, "0.2", engines) == "it has not registered again"
    old = _link("0.1", 11.0, reported)
    old.ws = _OpenSocket()  # type: ignore[assignment]
    assert back_problem(old, 10.0, "0.2", engines) == "it runs llmgw-agent 0.1, not 0.2"
    assert back_problem(old, 10.0, None, engines) is None  # a rollback takes any version
    moved = _link("0.2", 11.0, {"r1": 100, "r2": 999})
    moved.ws = _OpenSocket()  # type: ignore[assignment]
    assert back_problem(moved, 10.0, "0.2", engines) == "engine(s) not adopted under their pids yet: r2-0"
    moved.state = "Unreachable"
    assert back_problem(moved, 10.0, "0.2", engines) == "it is Unreachable"


def test_the_switch_keeps_bootstrap_venv_and_points_the_link_in_one_rename(tmp_path: Path) -> None:
    layout = render.Layout(prefix=str(tmp_path / "opt"))
    Path(layout.venv).mkdir(parents=True)
    Path(layout.venv, "marker").write_text("bootstrap")
    new = layout.venv_for("a" * 64)
    Path(new).mkdir(parents=True)
    kept = layout.venv_for("b" * 64)

    def sh(command: str) -> str:
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout

    assert sh(switch_command(layout, new, kept)).split() == ["was", kept]
    assert Path(layout.venv).resolve() == Path(new) and Path(kept, "marker").read_text() == "bootstrap"
    assert sh(switch_command(layout, kept, kept)).split() == ["was", new]  # the rollback
    assert Path(layout.venv).resolve() == Path(kept)


def test_the_cli_prints_each_node_and_the_steps_of_the_one_that_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    answer = {
        "ok": False,
        "agent_version": "0.1.1",
        "wheelhouse": "ab" * 32,
        "nodes": [
            {
                "node": "a",
                "status": "upgraded",
                "message": "llmgw-agent 0.1.0 -> 0.1.1, engines adopted",
                "steps": [],
            },
            {
                "node": "b",
                "status": "failed",
                "message": "install: pip said no",
                "steps": [
                    {"step": "verify", "status": "unchanged", "detail": "3 wheels match"},
                    {"step": "install", "status": "failed", "detail": "pip said no"},
                    {"step": "switch", "status": "skipped", "detail": "an earlier step failed"},
                ],
            },
            {
                "node": "c",
                "status": "not_attempted",
                "message": "an earlier node failed; not touched",
                "steps": [],
            },
            {"node": "local", "status": "not_managed", "message": NOT_MANAGED, "steps": []},
        ],
    }
    print_answer(answer)
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        "upgrading to llmgw-agent 0.1.1 (wheelhouse abababababab)",
        "a: upgraded: llmgw-agent 0.1.0 -> 0.1.1, engines adopted",
        "b: failed: install: pip said no",
        "verify: unchanged 3 wheels match",
        "install: failed pip said no",
        "c: not attempted: an earlier node failed; not touched",
        "local: skipped: " + NOT_MANAGED,
    ]
