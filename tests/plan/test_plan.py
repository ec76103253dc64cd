"""`llmgw plan` as a value and its three renderings, held by golden files.

Regenerate the golden files after an intended change with `LLMGW_UPDATE_GOLDEN=1 pytest tests/plan`
and read the diff before committing it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from placement.builders import cpu_profile, entry, gpu_profile

from llmgw.core.config.models import ModelSpec
from llmgw.core.fleet.views import (
    GIB,
    DesiredNode,
    IfUndeclared,
    LiveGpu,
    LiveNode,
    LiveReplica,
    LiveShard,
    LiveState,
    ModelView,
)
from llmgw.core.plan import (
    Plan,
    exit_code,
    make_plan,
    plan_for_catalog,
    render,
    render_json,
    render_markdown,
    render_text,
)

GOLDEN = Path(__file__).parent / "golden"
CPU_ONLY = {"role": "cpu"}


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LLMGW_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with LLMGW_UPDATE_GOLDEN=1 once and read it"
    assert text == path.read_text()


def provider(env: str) -> dict:
    return {"url": "https://api.example.com/v1", "model": "gpt-x", "key": {"env": env}}


def desired_models() -> dict[str, ModelView]:
    qwen_gpu = gpu_profile("gpu", gpus=4, args={"max_model_len": 16384})
    return {
        "big": entry(gpu_profile("h100x8", gpus=8), gpu_profile("a100x8", gpus=8, gpu_class="a100-80g")),
        "ext": entry(min=0, max=0, provider=provider("EXT_KEY_NEW")),
        "gemma": entry(cpu_profile(cores=2, memory_gb=2, node_selector=CPU_ONLY), min=2, max=2),
        "qwen": entry(qwen_gpu, restart_on_profile_change=True),
        "sim-chat": entry(cpu_profile("sim", engine="sim", cores=1, memory_gb=None)),
        "tiny": entry(cpu_profile(cores=1, memory_gb=1)),
    }


def previous_models() -> dict[str, ModelSpec]:
    old_qwen = gpu_profile("gpu", gpus=4, args={"max_model_len": 8192})
    return {
        "big": desired_models()["big"].spec,
        "ext": entry(min=0, max=0, provider=provider("EXT_KEY_OLD")).spec,
        "gemma": entry(cpu_profile(cores=2, memory_gb=2, node_selector=CPU_ONLY), min=1, max=2).spec,
        "old": entry(cpu_profile(cores=2, memory_gb=2)).spec,
        "qwen": entry(old_qwen, restart_on_profile_change=True).spec,
        "tiny": entry(cpu_profile(cores=1, memory_gb=1)).spec,
    }


def live_state() -> LiveState:
    desired = desired_models()
    old_qwen_fp = entry(gpu_profile("gpu", gpus=4, args={"max_model_len": 8192})).fingerprints["gpu"]
    h100 = [LiveGpu(index=i, gpu_class="h100-80g", memory_bytes=80 * GIB) for i in range(8)]
    a100 = [LiveGpu(index=i, gpu_class="a100-80g", memory_bytes=80 * GIB, allocated=i < 2) for i in range(8)]
    engines = {"vllm": "0.10.1", "llamacpp": "b11434"}
    return LiveState(
        revision="1f2e3d4c5b6a",
        catalog_fingerprint="cafe",
        taken_at=1_780_000_000.0,
        nodes=[
            LiveNode(
                name="gpu-1", cpu_cores=64, memory_bytes=512 * GIB, gpus=h100, engines=engines, fabric="ib-a"
            ),
            LiveNode(
                name="gpu-2", cpu_cores=64, memory_bytes=512 * GIB, gpus=a100, engines={"vllm": "0.9.0"}
            ),
            LiveNode(
                name="cpu-1", cpu_cores=8, memory_bytes=16 * GIB, gpus=[], engines={"llamacpp": "b11434"}
            ),
            LiveNode(
                name="cpu-2", cpu_cores=None, memory_bytes=None, gpus=[], engines={"llamacpp": "b11434"}
            ),
            LiveNode(name="retired", state="Unreachable", cpu_cores=4, memory_bytes=8 * GIB, gpus=[]),
        ],
        replicas=[
            LiveReplica(
                id="gemma-cpu-1",
                model="gemma",
                profile="cpu",
                fingerprint=desired["gemma"].fingerprints["cpu"],
                shards=[LiveShard(node="cpu-1", state="ready")],
                state="ready",
            ),
            LiveReplica(
                id="qwen-gpu-1",
                model="qwen",
                profile="gpu",
                fingerprint=old_qwen_fp,
                shards=[LiveShard(node="gpu-1", gpus=[0, 1, 2, 3], state="ready")],
                state="ready",
            ),
            LiveReplica(
                id="old-cpu-1",
                model="old",
                profile="cpu",
                fingerprint="0123abcd",
                shards=[LiveShard(node="cpu-1", state="ready")],
                state="ready",
            ),
            LiveReplica(
                id="tiny-cpu-1",
                model="tiny",
                profile="cpu",
                fingerprint="from-an-older-revision",
                shards=[LiveShard(node="cpu-2", state="ready")],
                state="ready",
                adopted=True,
            ),
        ],
        models=previous_models(),
    )


def declared_nodes() -> dict[str, DesiredNode]:
    names = ["gpu-1", "gpu-2", "cpu-1", "cpu-2", "gpu-new"]
    return {
        n: DesiredNode(
            n, labels={} if n.startswith("gpu") else CPU_ONLY, fabric="ib-a" if n.startswith("gpu") else None
        )
        for n in names
    }


@pytest.fixture
def plan() -> Plan:
    return make_plan(desired_models(), live_state(), nodes=declared_nodes(), revision="9a8b7c6d5e4f")


def test_plan_value(plan):
    assert [(m.model, m.change) for m in plan.models] == [
        ("ext", "change"),
        ("gemma", "change"),
        ("old", "remove"),
        ("qwen", "change"),
        ("sim-chat", "add"),
    ]
    gemma = next(m for m in plan.models if m.model == "gemma")
    assert [(f.path, f.old, f.new) for f in gemma.fields] == [("scaling.min", "1", "2")]
    assert [(s.model, s.nodes) for s in plan.starts] == [("gemma", ("cpu-2",)), ("sim-chat", ("gpu-1",))]
    assert [(r.replica_id, r.new_nodes) for r in plan.restarts] == [("qwen-gpu-1", ("gpu-1",))]
    assert [(s.replica_id, s.drain) for s in plan.stops] == [("old-cpu-1", True)]
    assert [s.replica_id for s in plan.stale] == [
        "tiny-cpu-1"
    ]  # adopted under on_change: manual: shown, kept like any other
    assert [(n.node, n.change) for n in plan.nodes] == [("gpu-new", "bootstrap"), ("retired", "drain")]
    (big,) = plan.unplaceable
    reasons = {p: dict(rejected) for p, _, rejected in big.profiles}
    assert reasons["h100x8"]["gpu-1"] == "has 0 free h100-80g, needs 8"
    assert (
        reasons["a100x8"]["gpu-2"] == "has vllm 0.9.0, needs 0.10.1" or "6 free" in reasons["a100x8"]["gpu-2"]
    )
    assert reasons["h100x8"]["retired"].startswith("node is Unreachable; no longer declared;")
    assert plan.summary() == (
        "Plan: 2 to start, 1 to restart, 1 to stop. Configuration: 3 models to change. 1 model cannot be placed."
    )
    assert plan.has_changes


def test_secret_references_are_shown_by_name_and_never_resolved(plan, monkeypatch):
    # A reviewer must see that a key now comes from another variable; what the variable holds is never read.
    monkeypatch.setenv("EXT_KEY_NEW", "sk-live-value-never-printed")
    ext = next(m for m in plan.models if m.model == "ext")
    assert [(f.path, f.old, f.new) for f in ext.fields] == [
        ("provider.key", "{env: EXT_KEY_OLD}", "{env: EXT_KEY_NEW}")
    ]
    for fmt in ("text", "json", "markdown"):
        out = render(plan, fmt)  # type: ignore[arg-type]
        assert "{env: EXT_KEY_NEW}" in out and "sk-live-value-never-printed" not in out


def test_secret_looking_literals_are_masked():
    old = entry(cpu_profile(cores=1, memory_gb=1, env={"HF_TOKEN": "hf_old_literal"}))
    new = entry(cpu_profile(cores=1, memory_gb=1, env={"HF_TOKEN": "hf_new_literal"}))
    plan = make_plan({"m": new}, LiveState(models={"m": old.spec}))
    (change,) = plan.models
    assert [(f.path, f.old, f.new) for f in change.fields] == [
        ("profiles[cpu].env.HF_TOKEN", "(secret)", "(secret)")
    ]
    assert "hf_new_literal" not in render_text(plan) + render_json(plan) + render_markdown(plan)


def test_golden_text(plan):
    golden("plan.txt", render_text(plan))


def test_golden_json(plan):
    text = render_json(plan)
    assert list(json.loads(text)) == sorted(json.loads(text))
    golden("plan.json", text)


def test_golden_markdown(plan):
    golden("plan.md", render_markdown(plan))


def test_saved_state_round_trips_and_its_hash_ignores_the_time():
    state = live_state()
    golden("state.json", state.model_dump_json(indent=2, by_alias=True) + "\n")
    again = LiveState.model_validate_json((GOLDEN / "state.json").read_text())
    assert again.content_hash() == state.content_hash()
    assert again.model_copy(update={"taken_at": 1.0}).content_hash() == state.content_hash()
    moved = again.model_copy(update={"replicas": again.replicas[:-1]})
    assert moved.content_hash() != state.content_hash()


def test_no_changes():
    desired = {"tiny": entry(cpu_profile(cores=1, memory_gb=1))}
    live = LiveState(
        revision="abc",
        nodes=[LiveNode(name="n", cpu_cores=4, memory_bytes=8 * GIB, engines={"llamacpp": "b1"})],
        replicas=[
            LiveReplica(
                id="tiny-cpu-1",
                model="tiny",
                profile="cpu",
                fingerprint=desired["tiny"].fingerprints["cpu"],
                shards=[LiveShard(node="n", state="ready")],
                state="ready",
            )
        ],
        models={"tiny": desired["tiny"].spec},
    )
    plan = make_plan(desired, live, nodes={"n": DesiredNode("n")}, revision="abc")
    assert not plan.has_changes
    assert render_text(plan).endswith("No changes. The fleet matches the cluster repo.\n")
    assert json.loads(render_json(plan))["has_changes"] is False


def test_an_engine_killed_by_hand_is_drift_against_the_revision_and_the_plan_heals_it():
    """The repo did not change, the fleet did: a replica whose engine was killed (or stopped) outside llmgw
    is drift, said as such, and the plan's actions put back what the revision declares."""
    desired = {"tiny": entry(cpu_profile(cores=1, memory_gb=1), min=2, max=2)}
    fp = desired["tiny"].fingerprints["cpu"]

    def replica(rid: str, state: str) -> LiveReplica:
        return LiveReplica(
            id=rid,
            model="tiny",
            profile="cpu",
            fingerprint=fp,
            shards=[LiveShard(node="n", state=state)],
            state="ready",
        )

    live = LiveState(
        revision="abc",
        nodes=[LiveNode(name="n", cpu_cores=4, memory_bytes=8 * GIB, engines={"llamacpp": "b1"})],
        replicas=[replica("tiny-cpu-1", "ready"), replica("tiny-cpu-2", "failed")],
        models={"tiny": desired["tiny"].spec},
    )
    plan = make_plan(desired, live, nodes={"n": DesiredNode("n")}, revision="abc")
    [drift] = plan.drift
    assert drift.replica_id == "tiny-cpu-2" and "is not running (shard 0 on n failed" in drift.words
    assert "the revision declares 2 replica(s) of tiny: replaced" in drift.words
    assert [s.replica_id for s in plan.stops] == ["tiny-cpu-2"]
    assert [s.reason for s in plan.starts] == ["replaces tiny-cpu-2 (failed)"]
    text = render_text(plan)
    assert (
        "Drift (where the fleet differs from the applied revision):\n  ! tiny-cpu-2 (tiny/cpu) on n" in text
    )
    assert json.loads(render_json(plan))["drift"][0]["replica"] == "tiny-cpu-2"
    healthy = live.model_copy(
        update={"replicas": [replica("tiny-cpu-1", "ready"), replica("tiny-cpu-3", "ready")]}
    )
    assert make_plan(desired, healthy, nodes={"n": DesiredNode("n")}, revision="abc").drift == ()


def test_undeclared_nodes_say_whether_the_controller_removes_or_keeps_them():
    desired = {"tiny": entry(cpu_profile(cores=1, memory_gb=1), min=2, max=2)}
    fp = desired["tiny"].fingerprints["cpu"]

    def node(name: str, action: IfUndeclared | None) -> LiveNode:
        return LiveNode(
            name=name, cpu_cores=4, memory_bytes=8 * GIB, engines={"llamacpp": "b1"}, if_undeclared=action
        )

    def replica(name: str) -> LiveReplica:
        shard = LiveShard(node=name, state="ready")
        return LiveReplica(id=f"tiny-{name}", model="tiny", profile="cpu", fingerprint=fp, shards=[shard])

    live = LiveState(
        revision="abc",
        nodes=[node("n", None), node("kept", "keep"), node("leaving", "remove")],
        replicas=[replica("kept"), replica("leaving")],
        models={"tiny": desired["tiny"].spec},
    )
    plan = make_plan(desired, live, nodes={"n": DesiredNode("n")}, revision="abc")
    assert [(n.node, n.change) for n in plan.nodes] == [("leaving", "drain")]
    assert "then its agent removed" in plan.nodes[0].reason
    assert [(n.node, n.change) for n in plan.kept] == [("kept", "keep")]
    assert plan.kept[0].reason.startswith(
        "not declared in the repo, left as it is: its 1 replica keeps running"
    )
    # The leaving node's replica is replaced elsewhere first (make-before-break): a start, no stop yet.
    assert [(s.model, s.nodes, s.reason) for s in plan.starts] == [
        ("tiny", ("n",), "replaces tiny-leaving (node leaving removed from the repo)")
    ]
    assert plan.stops == ()
    text = render_text(plan)
    assert "  = keep kept: not declared in the repo, left as it is" in text
    assert text.rstrip().endswith("1 node not declared in the repo left as it is.")
    assert json.loads(render_json(plan))["kept_nodes"][0]["node"] == "kept"
    assert "| `=` | keep `kept` |" in render_markdown(plan)

    # Beside n, a kept node.
    only = live.model_copy(update={"nodes": [node("n", None), node("kept", "keep")], "replicas": []})
    quiet = make_plan(desired, only, nodes={"n": DesiredNode("n")}, revision="abc")
    assert quiet.nodes == () and [n.node for n in quiet.kept] == ["kept"]
    # A kept node is not cordoned: CPU replicas spread over it and n, as the controller would place them.
    assert sorted(s.nodes for s in quiet.starts) == [("kept",), ("n",)]
    assert quiet.summary().endswith("1 node not declared in the repo left as it is.")
    # Nothing to do: the summary still does not say the fleet matches the repo, and the exit code is 0.
    idle = make_plan({}, only.model_copy(update={"models": {}}), nodes={"n": DesiredNode("n")}, revision="a")
    assert idle.summary() == "No changes. 1 node not declared in the repo left as it is."
    assert exit_code(idle) == 0


def test_without_applied_models_there_is_no_model_diff():
    live = live_state().model_copy(update={"models": None})
    plan = make_plan(desired_models(), live)
    assert plan.models == () and not plan.models_known
    assert "no model diff" in render_text(plan)


def test_live_state_from_views_round_trips():
    state = live_state()
    again = LiveState.from_views(
        state.node_views(),
        state.replica_views(),
        revision=state.revision,
        taken_at=state.taken_at,
        models=state.models,
        catalog_fingerprint=state.catalog_fingerprint,
    )
    assert again.content_hash() == state.content_hash()
    assert again.node_views() == state.node_views()


def test_plan_for_the_example_cluster_repo_against_an_empty_fleet():
    from llmgw.adapters.repo_files import load_repo

    root = Path(__file__).parents[2] / "examples" / "cluster-repo"
    loaded = load_repo(root, revision="abc123")
    assert loaded.catalog is not None, loaded.errors
    plan = plan_for_catalog(loaded.catalog, LiveState(revision=None, models={}))
    assert {m.model for m in plan.models if m.change == "add"} == set(loaded.catalog.models)
    assert [n.change for n in plan.nodes] == ["bootstrap"] * len(loaded.catalog.nodes)
    assert plan.starts == () and len(plan.unplaceable) >= 1  # no node has been seen yet
    assert exit_code(plan) == 2
    assert exit_code(make_plan({}, LiveState())) == 0


def _catalog(tmp_path: Path, files: dict[str, str]):  # type: ignore[no-untyped-def]
    from llmgw.adapters.repo_files import load_repo

    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    loaded = load_repo(tmp_path)
    assert loaded.catalog is not None, [str(e) for e in loaded.errors]
    return loaded.catalog


MODEL_DOC = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: m, labels: {tier: %s}}
spec:
  context_length: 4096
  scaling: {min: 0, max: 0}
  provider: {url: "https://api.example.com/v1", model: x}
"""
PROJECT_DOC = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: p}
spec: {organization: acme%s}
"""


def test_spelling_out_a_default_or_reordering_is_no_change(tmp_path):
    from llmgw.core.plan import catalog_documents, document_changes

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    before = _catalog(tmp_path / "a", {"m.yaml": MODEL_DOC % "gold", "t.yaml": PROJECT_DOC % ""})
    after = _catalog(
        tmp_path / "b",
        {"m.yaml": MODEL_DOC % "gold", "t.yaml": PROJECT_DOC % ", limits: {rpm: null}, models: null"},
    )
    assert document_changes(catalog_documents(before), catalog_documents(after)) == ()


def test_a_models_labels_are_compared_its_spec_is_the_model_diffs(tmp_path):
    from llmgw.core.plan import catalog_documents

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    before = _catalog(tmp_path / "a", {"m.yaml": MODEL_DOC % "gold"})
    after = _catalog(tmp_path / "b", {"m.yaml": MODEL_DOC % "silver"})
    live = LiveState(models={"m": before.models["m"].spec}, documents=catalog_documents(before))
    plan = plan_for_catalog(after, live)
    assert plan.models == ()
    assert [(d.kind, d.name, [(f.path, f.old, f.new) for f in d.fields]) for d in plan.documents] == [
        ("Model", "m", [("metadata.labels.tier", '"gold"', '"silver"')])
    ]
    assert exit_code(plan) == 2
    assert exit_code(plan_for_catalog(before, live)) == 0
