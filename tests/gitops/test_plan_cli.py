"""`llmgw plan` and `llmgw apply` through the CLI, without a controller: a saved live state (`--state`).

Golden-free: each test asserts the lines that matter (summary, node reasons, the restart), not whole outputs;
the exact renderings are held by tests/plan's golden files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gitops.repo_fixture import live_state, sim_model, write_repo
from llmgw.adapters.repo_files import load_repo
from llmgw.cli import admin_client
from llmgw.cli.main import app
from llmgw.cli.repo import follow
from llmgw.cli.repo.plan_cmds import check_saved_plan, read_plan_file
from llmgw.core.plan import StalePlan

SUMMARY = "Plan: 1 to start, 1 to restart, 1 to stop. 1 model cannot be placed."


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root: Path = write_repo(tmp_path / "repo")
    return root


@pytest.fixture
def state(tmp_path: Path, repo: Path) -> Path:
    path = tmp_path / "state.json"
    path.write_text(live_state(repo).model_dump_json(indent=2))
    return path


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_text_shows_summary_unplaceable_reasons_and_stale_restart(repo: Path, state: Path) -> None:
    code, out, _ = run("plan", str(repo), "--state", str(state))
    assert code == 0  # without --detailed-exitcode success is 0 even with changes
    assert out.rstrip().endswith(SUMMARY)
    assert "+ start sim-new-sim-1 (sim-new/sim) on cpu-1" in out
    assert "-/+ restart sim-old-1 (sim-old/sim) on cpu-1: profile sim changed" in out
    assert "- stop gone-1 (gone/sim) on cpu-2" in out
    assert "cpu-1: has 2 free CPU cores, needs 64" in out
    assert "cpu-2: has 1 free CPU cores, needs 64" in out


def test_json_has_every_action_and_the_node_reasons(repo: Path, state: Path) -> None:
    code, out, _ = run("plan", str(repo), "--state", str(state), "--format", "json")
    assert code == 0
    body = json.loads(out)
    assert body["summary"] == SUMMARY
    assert [s["model"] for s in body["replicas"]["start"]] == ["sim-new"]
    assert [r["id"] for r in body["replicas"]["restart"]] == ["sim-old-1"]
    assert [s["id"] for s in body["replicas"]["stop"]] == ["gone-1"]
    (huge,) = body["unplaceable"]
    assert huge["model"] == "huge"
    assert huge["profiles"][0]["rejected"] == {
        "cpu-1": "has 2 free CPU cores, needs 64",
        "cpu-2": "has 1 free CPU cores, needs 64",
    }


def test_markdown_is_a_pr_comment(repo: Path, state: Path) -> None:
    code, out, _ = run("plan", str(repo), "--state", str(state), "--format", "markdown")
    assert code == 0
    assert out.startswith("### llmgw plan")
    assert f"**{SUMMARY}**" in out
    assert "| `-/+` | restart `sim-old-1` | cpu-1 |" in out
    assert "cannot place `huge`" in out and "cpu-2: has 1 free CPU cores, needs 64" in out


def test_detailed_exitcode_0_no_changes_2_changes_1_error(tmp_path: Path, repo: Path, state: Path) -> None:
    assert run("plan", str(repo), "--state", str(state), "--detailed-exitcode")[0] == 2

    # The same repo against a fleet that already runs it: nothing to do.
    calm = tmp_path / "calm"
    (calm / "models").mkdir(parents=True)
    (calm / "cluster.yaml").write_text((repo / "cluster.yaml").read_text())
    (calm / "nodes.yaml").write_text((repo / "nodes.yaml").read_text())
    (calm / "models" / "a.yaml").write_text(sim_model("sim-a", min_=0))
    loaded = load_repo(calm)
    assert loaded.repo is not None
    calm_state = tmp_path / "calm.json"
    live = live_state(repo).model_copy(
        update={"replicas": [], "models": {"sim-a": loaded.repo.catalog.models["sim-a"].spec}}
    )
    calm_state.write_text(live.model_dump_json())
    code, out, _ = run("plan", str(calm), "--state", str(calm_state), "--detailed-exitcode")
    assert (code, out.strip().splitlines()[-1]) == (0, "No changes. The fleet matches the cluster repo.")

    (repo / "models" / "bad.yaml").write_text(sim_model("bad").replace("context_length", "context_lenght"))
    code, out, err = run("plan", str(repo), "--state", str(state), "--detailed-exitcode")
    assert code == 1
    assert "models/bad.yaml:5:3" in err and "context_lenght" in err
    assert "Plan:" not in out

    code, out, _ = run("plan", str(repo), "--state", str(state), "--format", "markdown")
    assert code == 1 and "The cluster repo is invalid: 1 error(s)" in out  # the PR still gets a comment


def test_a_broken_state_file_or_both_sources_is_an_error(tmp_path: Path, repo: Path, state: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": "no"}')
    code, _, err = run("plan", str(repo), "--state", str(bad), "--detailed-exitcode")
    assert code == 1 and "is not a live state" in err and "--save-state" in err
    code, _, err = run("plan", str(repo), "--state", str(state), "--controller", "http://127.0.0.1:1")
    assert code == 1 and "not both" in err


def test_secrets_never_printed(tmp_path: Path, repo: Path, state: Path) -> None:
    (repo / "models" / "ext.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Model\nmetadata: {name: ext}\nspec:\n  context_length: 4096\n"
        "  provider: {url: 'https://api.example.com/v1', model: gpt-x, key: {env: LLMGW_SECRET_SUPER_NAME}}\n"
    )
    for fmt in ("text", "json", "markdown"):
        code, out, err = run("plan", str(repo), "--state", str(state), "--format", fmt)
        assert code == 0, err
        assert "ext" in out and "LLMGW_SECRET_SUPER_NAME" not in out
        # A reference's name is not secret (the repo shows it): the reviewer is told the binding line to add.
        assert "$LLMGW_SECRET_SUPER_NAME: {purposes: [provider-key], hosts: [api.example.com]}" in err


def test_plan_file_refuses_when_the_live_state_moved_on(tmp_path: Path, repo: Path, state: Path) -> None:
    out = tmp_path / "plan.json"
    assert run("plan", str(repo), "--state", str(state), "--out", str(out))[0] == 0
    saved = read_plan_file(out)
    assert saved is not None and saved["repo"]["path"] == str(repo.resolve())
    loaded = load_repo(repo)
    live = live_state(repo)
    check_saved_plan(saved, loaded, live)  # the same state: fine

    # A node's free disk moved: the hash changed, the plan did not: still fine.
    jitter = live.model_copy(
        update={"nodes": [n.model_copy(update={"disk_free_bytes": 1}) for n in live.nodes]}
    )
    assert jitter.content_hash() != saved["live"]["state_hash"]
    check_saved_plan(saved, loaded, jitter)

    # A replica became something else: the plan would differ.
    moved = live.model_copy(update={"replicas": live.replicas[:1]})
    with pytest.raises(StalePlan, match="live state changed after it was made"):
        check_saved_plan(saved, loaded, moved)
    # Another revision was applied meanwhile.
    with pytest.raises(StalePlan, match=r"run `llmgw plan --out FILE` again") as info:
        check_saved_plan(saved, loaded, live.model_copy(update={"revision": "f00d" * 10}))
    assert "f00df00df00d" in str(info.value)
    # The repo changed after the plan.
    (repo / "models" / "sim-new.yaml").write_text(sim_model("sim-new", decode_ms=3))
    with pytest.raises(StalePlan, match="changed after the plan was made"):
        check_saved_plan(saved, load_repo(repo), live)


def test_apply_refuses_an_invalid_repo_before_talking_to_anyone(repo: Path) -> None:
    (repo / "models" / "bad.yaml").write_text(sim_model("bad").replace("cpu_cores", "cpu_coers"))
    # An unreachable controller: the test fails if apply tried to reach it before validating.
    code, _out, err = run("apply", str(repo), "--controller", "http://127.0.0.1:1", env={"LLMGW_TOKEN": "t"})
    assert code == 1
    assert "models/bad.yaml" in err and "cpu_coers" in err
    assert "Nothing was applied" in err and "cannot reach" not in err


def test_token_order_and_messages(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    cands = admin_client.default_token_files(tmp_path / "repo", tmp_path / "cwd")
    assert cands == [
        (tmp_path / "cwd/.llmgw/controller/admin-token").resolve(),
        (tmp_path / "repo/.llmgw/controller/admin-token").resolve(),
    ]
    assert admin_client.resolve_token(f, {"LLMGW_TOKEN": "env"}, cands).value == "from-file"
    assert admin_client.resolve_token(None, {"LLMGW_TOKEN": "env"}, cands).value == "env"
    cands[1].parent.mkdir(parents=True)
    cands[1].write_text("generated\n")
    token = admin_client.resolve_token(None, {}, cands)
    assert token.value == "generated" and "generated" not in repr(token)
    cands[1].unlink()
    with pytest.raises(admin_client.AdminError, match="LLMGW_TOKEN") as info:
        admin_client.resolve_token(None, {}, cands)
    assert str(cands[0]) in str(info.value)


def test_token_file_location_agrees_with_the_controller(tmp_path: Path) -> None:
    """plan/apply find the token `llmgw up`/`llmgw controller` generate: the same default place."""
    from llmgw.controller.core import admin_token_from
    from llmgw.controller.parts.settings import ControllerOptions

    assert ControllerOptions.model_fields["state_dir"].default == admin_client.DEFAULT_STATE_DIR
    settings = ControllerOptions(repo=".", store="sqlite:///x.db", state_dir=tmp_path / "state")
    token = admin_token_from(settings)
    made = tmp_path / "state" / admin_client.TOKEN_FILE_NAME
    assert made.read_text().strip() == token
    assert admin_client.resolve_token(None, {}, [made]).value == token


def test_progress_verdicts() -> None:
    rev = "sha256:abc"
    models = [{"model": "a", "health": "Healthy", "ready": 1, "target": 1}]
    base = {"applied": {"revision": rev}, "sync": "Synced", "models": models}
    assert follow.progress(base, rev, was_applied=True).phase == "done"
    waiting = follow.progress(base | {"applied": {"revision": "old"}}, rev, was_applied=False)
    assert waiting.phase == "waiting" and "not applied yet" in waiting.why[0]
    replaced = follow.progress(base | {"applied": {"revision": "new"}}, rev, was_applied=True)
    assert replaced.phase == "failed" and "replaced" in replaced.why[0]
    slow = [{"model": "a", "health": "Progressing", "ready": 0, "target": 1}]
    p = follow.progress(base | {"models": slow}, rev, was_applied=True)
    assert p.phase == "waiting" and p.why == ("model a is Progressing (0/1 ready)",)
    bad = [{"model": "a", "health": "Degraded", "ready": 0, "target": 1}]
    degraded = follow.progress(base | {"models": bad}, rev, was_applied=True)
    assert degraded.phase == "waiting" and degraded.degraded == ("a",)
    # Degraded for less than the grace: still waiting (the controller retries); for longer: failed.
    since: dict[str, float] = {}
    assert follow.give_up(degraded, since, 100.0, 30.0).phase == "waiting"
    assert follow.give_up(degraded, since, 129.0, 30.0).phase == "waiting"
    assert follow.give_up(p, since, 131.0, 30.0).phase == "waiting" and since == {}  # recovered: reset
    assert follow.give_up(degraded, since, 140.0, 30.0).phase == "waiting"
    failed = follow.give_up(degraded, since, 170.0, 30.0)
    assert failed.phase == "failed" and failed.why == ("model a is Degraded (0/1 ready)",)
    assert follow.give_up(degraded, {}, 0.0, 0.0).phase == "failed"
    refused = base | {
        "applied": {"revision": "old"},
        "refused": {"revision": rev, "errors": ["x.yaml:1:1 no"]},
    }
    p = follow.progress(refused, rev, was_applied=False)
    assert p.phase == "failed" and "x.yaml:1:1 no" in p.why
    out_of_sync = follow.progress(base | {"sync": "OutOfSync"}, rev, was_applied=True)
    assert out_of_sync.phase == "waiting" and out_of_sync.why[0].startswith("sync is OutOfSync")


def test_an_unreachable_controller_is_exit_1_saying_where(repo: Path) -> None:
    code, out, err = run(
        "plan", str(repo), "--detailed-exitcode", "--controller", "127.0.0.1:1", env={"LLMGW_TOKEN": "t0k3n"}
    )
    assert code == 1 and out == ""
    assert "cannot reach the controller at http://127.0.0.1:1" in err and "t0k3n" not in err
