"""Issue 15, item 6: a reviewer can trust the plan. Every change of every kind the controller reads is shown,
in text, JSON and the markdown comment, and `--detailed-exitcode` is 2 for it, even when no replica moves.

A small cluster repo whose models are served by providers (so no replica has to run and "No changes" is
reachable offline), a saved live state made for it the way the controller makes one (`catalog_documents` of the
applied catalog), one commit-like edit per kind, and `llmgw plan` run as a CLI subprocess against the saved
state, as a CI job without cluster access runs it. The text output of each is a golden file under
tests/plan/golden/kinds/; regenerate with `LLMGW_UPDATE_GOLDEN=1 pytest tests/security/test_plan_every_kind.py`
and read the diff. The end-to-end test at the bottom does the same against a real controller following git.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.config import load_repo
from llmgw.fleet import LiveNode, LiveState
from llmgw.plan import catalog_documents, plan_for_catalog, render_json, render_markdown, render_text

GOLDEN = Path(__file__).parents[1] / "plan" / "golden" / "kinds"
LLMGW = str(Path(sys.executable).parent / "llmgw")
SECRET_VALUE = "sk-secret-value-never-in-a-plan"

REPO = {
    "cluster.yaml": """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: review}
spec:
  controller: {address: "127.0.0.1:7070"}
  router: {default_policy: balanced}
""",
    "nodes.yaml": """\
apiVersion: llmgw/v1
kind: Node
metadata:
  name: local
  labels: {role: dev}
spec: {local: true}
---
apiVersion: llmgw/v1
kind: Node
metadata:
  name: remote
  labels: {zone: a}
spec: {address: 10.0.0.5}
""",
    "policies.yaml": """\
apiVersion: llmgw/v1
kind: RoutingPolicy
metadata: {name: balanced}
spec:
  picker: p2c
  weights: {queue: 2, kv: 2, inflight: 1}
---
apiVersion: llmgw/v1
kind: RoutingPolicy
metadata: {name: session}
spec:
  picker: max_score
  weights: {session: 4, queue: 1}
""",
    "tenants.yaml": """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec:
  limits:
    rpm: 3000
    budget: {amount: 500, period: 30d}
---
apiVersion: llmgw/v1
kind: Team
metadata: {name: research}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Team
metadata: {name: ops}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: playground}
spec:
  team: research
  models: [chat, backup]
  limits:
    rpm: 600
    budget: {amount: 20, period: 30d}
""",
    "models.yaml": """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: chat}
spec:
  aliases: [assistant]
  context_length: 8192
  prices: {input_per_million: 1.0, output_per_million: 2.0}
  scaling: {min: 0, max: 0}
  fallbacks: [backup]
  provider:
    url: https://api.example.com/v1
    model: gpt-x
    key: {file: chat-key}
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: backup}
spec:
  context_length: 4096
  scaling: {min: 0, max: 0}
  provider:
    url: https://backup.example.com/v1
    model: gpt-y
    key: {env: BACKUP_KEY}
""",
}

# case -> (file, text before, text after, a line the text plan must contain)
CASES: dict[str, tuple[str, str, str, str]] = {
    "allowlist": (
        "tenants.yaml",
        "models: [chat, backup]",
        "models: [backup]",
        '~ spec.models: ["chat", "backup"] -> ["backup"]',
    ),
    "limit": ("tenants.yaml", "rpm: 600", "rpm: 60", "~ spec.limits.rpm: 600 -> 60"),
    "budget": (
        "tenants.yaml",
        "{amount: 500, period: 30d}",
        "{amount: 800, period: 30d}",
        "~ spec.limits.budget.amount: 500.0 -> 800.0",
    ),
    "parent": ("tenants.yaml", "team: research", "team: ops", '~ spec.team: "research" -> "ops"'),
    "policy-weight": (
        "policies.yaml",
        "{queue: 2, kv: 2, inflight: 1}",
        "{queue: 2, kv: 5, inflight: 1}",
        "~ spec.weights.kv: 2.0 -> 5.0",
    ),
    "default-policy": (
        "cluster.yaml",
        "default_policy: balanced",
        "default_policy: session",
        '~ spec.router.default_policy: "balanced" -> "session"',
    ),
    "node-label": ("nodes.yaml", "{zone: a}", "{zone: b}", '~ metadata.labels.zone: "a" -> "b"'),
    "node-address": (
        "nodes.yaml",
        "address: 10.0.0.5",
        "address: 10.0.0.6",
        '~ spec.address: "10.0.0.5" -> "10.0.0.6"',
    ),
    "secret-reference": (
        "models.yaml",
        "key: {file: chat-key}",
        "key: {file: chat-key-2}",
        "~ provider.key: {file: chat-key} -> {file: chat-key-2}",
    ),
    "model-alias": (
        "models.yaml",
        "aliases: [assistant]",
        "aliases: [assistant, helper]",
        '~ aliases: ["assistant"] -> ["assistant", "helper"]',
    ),
    "fallback": ("models.yaml", "fallbacks: [backup]", "fallbacks: []", '~ fallbacks: ["backup"] -> []'),
    "model-price": (
        "models.yaml",
        "output_per_million: 2.0",
        "output_per_million: 3.0",
        "~ prices.output_per_million: 2.0 -> 3.0",
    ),
}


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (root / rel).write_text(text)
    # What the provider key files hold: a plan names the file, never reads it.
    (root / "chat-key").write_text(SECRET_VALUE + "\n")
    (root / "chat-key-2").write_text(SECRET_VALUE + "-2\n")
    return root


def applied_state(root: Path) -> LiveState:
    """The live state a controller reports once it has applied the repo at `root`: both nodes seen, no
    replica (every model is a provider's), the applied models and documents."""
    loaded = load_repo(root)
    assert loaded.repo is not None, [str(e) for e in loaded.errors]
    catalog = loaded.repo.catalog

    def node(name: str) -> LiveNode:
        return LiveNode(name=name, cpu_cores=4, memory_bytes=8 << 30, engines={"sim": None})

    return LiveState(
        revision="applied0000",
        taken_at=1_780_000_000.0,
        nodes=[node("local"), node("remote")],
        models={name: m.spec for name, m in catalog.models.items()},
        documents=catalog_documents(catalog),
    )


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LLMGW_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with LLMGW_UPDATE_GOLDEN=1 once and read it"
    assert text == path.read_text()


def plan_cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env["BACKUP_KEY"] = SECRET_VALUE  # set, so a plan that resolved `{env: BACKUP_KEY}` would show it
    done = subprocess.run(
        [LLMGW, "plan", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = write(tmp_path / "repo", REPO)
    (tmp_path / "state.json").write_text(applied_state(root).model_dump_json(indent=2))
    return root


def edit(root: Path, case: str) -> None:
    rel, before, after, _ = CASES[case]
    text = (root / rel).read_text()
    assert text.count(before) == 1, f"{case}: {before!r} must occur once in {rel}"
    (root / rel).write_text(text.replace(before, after))


def test_i6_no_change_is_no_changes_and_exit_0(repo: Path) -> None:
    code, out, err = plan_cli("repo", "--state", "state.json", "--detailed-exitcode", cwd=repo.parent)
    assert code == 0, out + err
    assert out.strip().splitlines()[-1] == "No changes. The fleet matches the cluster repo."
    assert "Configuration:" not in out


@pytest.mark.parametrize("case", sorted(CASES))
def test_i6_every_kind_of_change_is_planned_and_exits_2(repo: Path, case: str) -> None:
    edit(repo, case)
    code, out, err = plan_cli(
        "repo", "--state", "state.json", "--detailed-exitcode", "--revision", case, cwd=repo.parent
    )
    assert code == 2, out + err
    assert CASES[case][3] in out, out
    assert "No changes" not in out and SECRET_VALUE not in out
    golden(f"{case}.txt", out)

    # The same change in the other two formats (in process: the renderers are pure).
    loaded = load_repo(repo, revision=case)
    assert loaded.repo is not None
    made = plan_for_catalog(loaded.repo.catalog, applied_state_from(repo.parent / "state.json"))
    body = json.loads(render_json(made))
    assert body["has_changes"] is True
    changed = [(d["kind"], d["name"], f["path"]) for d in body["documents"] for f in d["fields"]]
    changed += [("model", m["model"], f["path"]) for m in body["models"] for f in m["fields"]]
    path = CASES[case][3].split(" ", 2)[1].rstrip(":")
    assert [c for c in changed if c[2] == path], (path, changed)
    markdown = render_markdown(made)
    assert f"`{path}`" in markdown.split("<details>")[0], markdown  # in the table, not only folded away
    assert SECRET_VALUE not in render_text(made) + json.dumps(body) + markdown


def applied_state_from(path: Path) -> LiveState:
    return LiveState.model_validate_json(path.read_text())


def test_i6_every_change_at_once_golden_json_and_markdown(repo: Path) -> None:
    for case in CASES:
        edit(repo, case)
    for fmt, name in (("json", "all.json"), ("markdown", "all.md")):
        code, out, err = plan_cli(
            "repo",
            "--state",
            "state.json",
            "--detailed-exitcode",
            "-f",
            fmt,
            "--revision",
            "all",
            cwd=repo.parent,
        )
        assert code == 2, out + err
        assert SECRET_VALUE not in out
        golden(name, out)
    body = json.loads((GOLDEN / "all.json").read_text())
    kinds = {(d["kind"], d["name"]) for d in body["documents"]}
    assert kinds == {
        ("Cluster", "review"),
        ("Node", "remote"),
        ("RoutingPolicy", "balanced"),
        ("Organization", "acme"),
        ("Project", "playground"),
    }
    assert [m["model"] for m in body["models"]] == ["chat"]


def test_i6_added_and_removed_documents_list_what_they_set(repo: Path) -> None:
    tenants = repo / "tenants.yaml"
    tenants.write_text(
        tenants.read_text().replace(
            "---\napiVersion: llmgw/v1\nkind: Team\nmetadata: {name: ops}\nspec: {organization: acme}\n", ""
        )
        + "---\napiVersion: llmgw/v1\nkind: Project\nmetadata: {name: batch}\n"
        "spec: {organization: acme, models: [backup], limits: {concurrency: 4}}\n"
    )
    code, out, err = plan_cli("repo", "--state", "state.json", "--detailed-exitcode", cwd=repo.parent)
    assert code == 2, out + err
    assert '  - Team ops\n      - spec.organization: "acme"\n' in out, out
    assert "  + Project batch\n" in out
    assert "      + spec.limits.concurrency: 4\n" in out and '      + spec.organization: "acme"\n' in out
    assert "spec.limits.rpm" not in out.split("+ Project batch")[1]  # defaults are not listed


def test_i6_a_state_without_applied_documents_is_never_no_changes(repo: Path) -> None:
    old = applied_state_from(repo.parent / "state.json").model_copy(update={"documents": None})
    (repo.parent / "old.json").write_text(old.model_dump_json())
    code, out, err = plan_cli("repo", "--state", "old.json", "--detailed-exitcode", cwd=repo.parent)
    assert code == 2, out + err
    assert "No changes" not in out and "were not compared" in out.strip().splitlines()[-1]
