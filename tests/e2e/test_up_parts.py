"""The parts of `llmgw up` that need no running cluster: the refusal of an invalid repo, what it needs from a
repo, the example key kept and reused, and the progress lines (one per change)."""

from __future__ import annotations

import io
import shutil
import stat
from pathlib import Path

import pytest

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.deploy.up import (
    ProgressLog,
    UpError,
    UpSettings,
    admin_hint,
    ensure_key,
    fetch_detail,
    replica_detail,
    repo_facts,
    run_up,
    usage_text,
)
from llmgw.cli.deploy.up_processes import agent_argv, engine_ports
from llmgw.cli.repo.follow import ModelLine
from llmgw.store import Store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"


def test_invalid_repo_is_refused_with_validate_errors_and_exit_1(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo)
    sim = repo / "models" / "sim.yaml"
    sim.write_text(sim.read_text().replace("    min: 2\n", "    min: 2\n    mni: 3\n", 1))
    out, err = io.StringIO(), io.StringIO()
    code = run_up(UpSettings(repo=repo, state_dir=tmp_path / "state"), out, err)
    assert code == 1
    assert "models/sim.yaml:" in err.getvalue() and "mni" in err.getvalue()
    assert "invalid: 1 error(s)" in err.getvalue()
    assert not (tmp_path / "state").exists(), "nothing is started (or created) for an invalid repo"


def test_example_repo_facts() -> None:
    facts = repo_facts(load_repo(EXAMPLE))
    assert facts.local_node == "local"
    assert facts.project == "playground"
    assert facts.example_model == "gemma-3-270m"  # the real model, not a simulated one
    assert facts.cluster.router.listen == "127.0.0.1:8080"


def test_a_repo_without_a_local_node_says_what_to_add(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo)
    (repo / "nodes" / "local.yaml").unlink()
    with pytest.raises(UpError, match=r"no Node document has `spec.local: true`"):
        repo_facts(load_repo(repo))


async def test_key_is_kept_0600_and_reused_until_revoked(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'llmgw.db'}"
    key_file = tmp_path / "up" / "api-key"
    first, created = await ensure_key(dsn, key_file, "playground", 1000.0)
    assert created and first.startswith("sk-llmgw-")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    again, created = await ensure_key(dsn, key_file, "playground", 2000.0)
    assert (again, created) == (first, False)
    # Another project's up gets its own key; a revoked key is replaced.
    other, created = await ensure_key(dsn, key_file, "batch-jobs", 3000.0)
    assert created and other != first
    store = await Store.open(dsn)
    try:
        for key in await store.list_keys("batch-jobs"):
            await store.revoke_key(key.id, 3500.0)
    finally:
        await store.close()
    fresh, created = await ensure_key(dsn, key_file, "batch-jobs", 4000.0)
    assert created and fresh != other
    assert key_file.read_text().strip() == fresh


def test_progress_words() -> None:
    assert fetch_detail(None, None) == ""
    assert fetch_detail(45_000_000, 100_000_000) == "fetching weights: 40% of 100 MB"
    assert fetch_detail(3_000_000, None) == "fetching weights: 3 MB"
    assert replica_detail(["ready", "starting", "starting"], ["", ""], ["", ""]) == "2 starting"
    assert replica_detail(["starting"], ["fetching weights: 10% of 250 MB"], [""]).startswith("fetching")
    assert (
        replica_detail(["failed"], [""], ["engine exited: code 1\nmore"]) == "1 failed; engine exited: code 1"
    )
    line = ModelLine("gemma-3-270m", "Progressing", 0, 1, "1 starting")
    assert line.render() == "model gemma-3-270m: Progressing, 0/1 ready (1 starting)"
    assert ModelLine("sim-chat", "Healthy", 2, 2).render() == "model sim-chat: Healthy, 2/2 ready"


def test_engine_ports_reach_the_agent_and_a_bad_range_says_what_is_right(tmp_path: Path) -> None:
    token = tmp_path / "node-token"
    default = agent_argv(UpSettings(repo=EXAMPLE), "local", "http://127.0.0.1:7070", token, None)
    assert "--port-range" not in default, "no flag: the agent's own default range"
    moved = UpSettings(repo=EXAMPLE, engine_ports=engine_ports("21000-21099"))
    argv = agent_argv(moved, "local", "http://127.0.0.1:7070", token, None)
    assert argv[argv.index("--port-range") + 1] == "21000-21099"
    for bad in ("21000", "21099-21000", "0-10", "a-b", "21000-70000"):
        with pytest.raises(UpError, match=r"--engine-ports .*want LO-HI, two ports within 1-65535"):
            engine_ports(bad)


def test_usage_text_is_ready_to_paste() -> None:
    text = usage_text("http://127.0.0.1:8080/v1", "sk-llmgw-abc", "playground", "gemma-3-270m", "HINT")
    assert "export OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=sk-llmgw-abc" in text
    assert "curl -s http://127.0.0.1:8080/v1/chat/completions" in text
    assert "from openai import OpenAI" in text and 'model="gemma-3-270m"' in text
    assert "HINT." in text


def test_admin_hint_names_the_flags_only_when_they_are_needed(tmp_path: Path) -> None:
    default = UpSettings(repo=EXAMPLE)
    assert "no flags" in admin_hint(default, "http://127.0.0.1:7070", "127.0.0.1:7070", Path.cwd())
    moved = UpSettings(repo=EXAMPLE, state_dir=tmp_path / "s")
    hint = admin_hint(moved, "http://127.0.0.1:17070", "127.0.0.1:7070", Path.cwd())
    assert "--controller http://127.0.0.1:17070" in hint
    assert f"--token-file {tmp_path / 's' / 'controller' / 'admin-token'}" in hint


def test_progress_prints_a_line_per_change_not_per_poll() -> None:
    out = io.StringIO()
    progress = ProgressLog(out)
    for line in [
        "model a: Progressing, 0/1 ready",
        "model a: Progressing, 0/1 ready",
        "model a: Healthy, 1/1 ready",
    ]:
        progress.say("model:a", line)
    progress.say("model:b", "model b: Healthy, 1/1 ready")
    shown = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert shown == [
        "model a: Progressing, 0/1 ready",
        "model a: Healthy, 1/1 ready",
        "model b: Healthy, 1/1 ready",
    ]
