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

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw.adapters.repo_files import load_repo
from llmgw.core.fleet.views import LiveNode, LiveState
from llmgw.core.plan import catalog_documents, plan_for_catalog, render_json, render_markdown, render_text

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
    key: {env: LLMGW_SECRET_BACKUP_KEY}
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
    env["LLMGW_SECRET_BACKUP_KEY"] = (
        SECRET_VALUE  # set, so a plan that resolved `{env: LLMGW_SECRET_BACKUP_KEY}` would show it
    )
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


# ------------------------------------------------------------------------------------------------ end to end

EXAMPLE = Path(__file__).parents[2] / "examples" / "cluster-repo"
# The example's gemma, served by the sim engine: planning needs no llama.cpp, and nothing else of it changes.
GEMMA_ON_SIM = """\
apiVersion: llmgw/v1
kind: Model
metadata:
  name: gemma-3-270m
spec:
  aliases: [gemma]
  context_length: 2048
  prices: {input_per_million: 0.02, output_per_million: 0.04}
  scaling: {min: 1, max: 1}
  fallbacks: [sim-chat]
  class: interactive
  profiles:
    - {name: cpu, engine: sim, cpu_cores: 1, args: {decode_ms_per_token: 1}}
"""


async def cli(cwd: Path, *args: str) -> tuple[int, str, str]:
    """`llmgw ARGS` as a subprocess, without blocking the controller that runs in this event loop."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    proc = await asyncio.create_subprocess_exec(
        LLMGW, *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 180)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.integration
async def test_i6_live_controller_plans_the_issues_tenant_commit_and_exits_2(tmp_path: Path) -> None:
    """As the issue tried it: a real controller following a git copy of the example repo and a real agent
    running its models; a commit that removes gemma from playground's allowlist and cuts its rpm from 600 to
    60, then one that changes a policy's weights and the Cluster's default_policy. `llmgw plan` (found by the
    Cluster's address and the controller's token file, as a new user runs it) shows each and exits 2; once
    applied, the plan is "No changes" again, so the live side reports the applied documents."""
    from controller.helpers import Agents, Repo, settings_for, start
    from support import free_port, wait_for

    port = free_port()
    repo = Repo(tmp_path / "repo", use_git=True)
    files = {
        str(p.relative_to(EXAMPLE)): p.read_text()
        for p in EXAMPLE.rglob("*.yaml")
        if ".pre-commit" not in p.name
    }
    files["cluster.yaml"] = files["cluster.yaml"].replace("127.0.0.1:7070", f"127.0.0.1:{port}")
    files["models/gemma.yaml"] = GEMMA_ON_SIM
    first = repo.write(files, "the example repo")
    state_dir = tmp_path / ".llmgw" / "controller"  # where the CLI run from tmp_path finds the admin token
    settings = settings_for(
        tmp_path,
        repo.path,
        listen=f"127.0.0.1:{port}",
        admin_token_file=None,
        state_dir=state_dir,
        poll_s=3600.0,  # read once at start: later commits reach it only by `llmgw apply`
        settle_s=0.0,
    )
    agents = Agents(tmp_path, state_dir / "admin-token")
    running, admin = await start(settings)
    try:
        agents.start("local", f"127.0.0.1:{port}", cpu_cores=8)
        await _wait_synced_and_healthy(admin, first, wait_for)
        code, out, err = await cli(tmp_path, "plan", "repo", "--detailed-exitcode")
        assert (code, out.strip().splitlines()[-1]) == (
            0,
            "No changes. The fleet matches the cluster repo.",
        ), out + err

        tenants = (repo.path / "tenants" / "acme.yaml").read_text()
        edited = tenants.replace('models: [gemma, "sim-*"]', 'models: ["sim-*"]').replace(
            "rpm: 600", "rpm: 60"
        )
        assert edited != tenants
        repo.write({"tenants/acme.yaml": edited}, "playground: no gemma, 60 rpm")
        code, out, err = await cli(tmp_path, "plan", "repo", "--detailed-exitcode")
        assert code == 2, out + err
        assert "  ~ Project playground\n" in out
        assert "      ~ spec.limits.rpm: 600 -> 60\n" in out
        assert '      ~ spec.models: ["gemma", "sim-*"] -> ["sim-*"]\n' in out
        assert out.strip().splitlines()[-1] == (
            "Plan: 0 to start, 0 to restart, 0 to stop. Configuration: 1 Project to change."
        )

        policies = (repo.path / "policies" / "routing.yaml").read_text()
        cluster = (repo.path / "cluster.yaml").read_text()
        second = repo.write(
            {
                "policies/routing.yaml": policies.replace("    kv: 2 ", "    kv: 3 ", 1),
                "cluster.yaml": cluster.replace("default_policy: balanced", "default_policy: session"),
            },
            "weights and default policy",
        )
        code, out, err = await cli(tmp_path, "plan", "repo", "--detailed-exitcode", "-f", "json")
        assert code == 2, out + err
        body = json.loads(out)
        changed = {
            (d["kind"], d["name"], f["path"], f["old"], f["new"])
            for d in body["documents"]
            for f in d["fields"]
        }
        assert changed == {
            ("Project", "playground", "spec.limits.rpm", "600", "60"),
            ("Project", "playground", "spec.models", '["gemma", "sim-*"]', '["sim-*"]'),
            ("RoutingPolicy", "balanced", "spec.weights.kv", "2.0", "3.0"),
            ("Cluster", "laptop", "spec.router.default_policy", '"balanced"', '"session"'),
        }
        code, out, err = await cli(tmp_path, "plan", "repo", "--detailed-exitcode", "-f", "markdown")
        assert code == 2, out + err
        table = out.split("<details>")[0]
        assert (
            '| `~` | Cluster `laptop` |  | `spec.router.default_policy`: "balanced" -> "session" |' in table
        )

        code, out, err = await cli(tmp_path, "apply", "repo", "--wait", "--timeout", "90s")
        assert code == 0, out + err
        await _wait_synced_and_healthy(admin, second, wait_for)
        code, out, err = await cli(tmp_path, "plan", "repo", "--detailed-exitcode")
        assert (code, out.strip().splitlines()[-1]) == (
            0,
            "No changes. The fleet matches the cluster repo.",
        ), out + err
    finally:
        await running.stop()
        agents.cleanup()


async def _wait_synced_and_healthy(admin: Any, revision: str, wait_for: Any) -> None:
    async def ready() -> bool:
        s = await admin.get("/api/v1/status")
        synced = (s["applied"] or {}).get("revision") == revision and s["sync"] == "Synced"
        health = {m["model"]: m["health"] for m in s["models"]}
        wanted = ("gemma-3-270m", "sim-chat", "sim-embed")
        return synced and all(health.get(m) == "Healthy" for m in wanted)

    await wait_for(ready, 120, f"revision {revision[:12]} Synced with its models Healthy")
