"""The example cluster repo's CI workflow and pre-commit hook call commands and flags that exist."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer
from ruamel.yaml import YAML

from llmgw.adapters.repo_files import yaml_files
from llmgw.cli.main import app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"
WORKFLOW = EXAMPLE / ".github" / "workflows" / "llmgw.yml"
PRE_COMMIT = EXAMPLE / ".pre-commit-config.yaml"


def llmgw_calls(text: str) -> list[list[str]]:
    calls = []
    for line in text.splitlines():
        words = shlex.split(line.strip().split(" > ")[0]) if "llmgw " in line else []
        if words and words[0] == "llmgw":
            calls.append(words[1:])
    return calls


def check_call(words: list[str]) -> None:
    group = typer.main.get_command(app)
    command = group.commands[words[0]]  # type: ignore[attr-defined]
    known = {opt for p in command.params for opt in p.opts}
    for word in words[1:]:
        if word.startswith("--"):
            assert word in known, f"llmgw {words[0]} has no option {word} (has {sorted(known)})"


def test_workflow_runs_validate_plan_and_apply_with_real_flags() -> None:
    doc: Any = YAML(typ="safe").load(WORKFLOW.read_text())
    assert set(doc["on"]) == {"pull_request", "push"}
    runs = "\n".join(step.get("run", "") for job in doc["jobs"].values() for step in job["steps"])
    calls = llmgw_calls(runs)
    assert ["validate", "--format", "github", "."] in calls
    assert any(c[0] == "plan" and "markdown" in c and "--state" in c for c in calls)
    assert any(c[0] == "plan" and "markdown" in c and "--state" not in c for c in calls)
    assert any(c[0] == "apply" and "--wait" in c for c in calls)
    for call in calls:
        check_call(call)
    scripts = [s.get("with", {}).get("script", "") for j in doc["jobs"].values() for s in j["steps"]]
    assert any("createComment" in s and "updateComment" in s for s in scripts)


def test_pre_commit_hook_runs_validate_over_the_whole_repo() -> None:
    doc: Any = YAML(typ="safe").load(PRE_COMMIT.read_text())
    (hook,) = [h for r in doc["repos"] for h in r["hooks"]]
    assert hook["pass_filenames"] is False
    (call,) = llmgw_calls(hook["entry"])
    assert call[0] == "validate"
    check_call(call)


def test_the_loader_does_not_read_ci_or_hook_files() -> None:
    names = [str(p.relative_to(EXAMPLE)) for p in yaml_files(EXAMPLE)]
    assert names and not [n for n in names if n.startswith(".") or "/." in n]
