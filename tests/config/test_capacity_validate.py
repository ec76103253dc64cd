"""`llmgw validate` on capacity: classes a model must name, the rollout block and its deprecated flag, GPU
quotas that the models' minimum must fit; each error at its file:line:col, saying what would be right."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.main import app
from llmgw.core.fleet.views import model_views

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: c}
spec:
  classes: [critical, interactive, batch]
"""

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: %(name)s}
spec:
  context_length: 4096
  %(extra)s
  scaling: {min: %(min)s, max: 4}
  profiles:
    - {name: gpu, engine: vllm, gpu_class: h100-80g, gpus: 4, tp: 4}
  source: {url: "https://example.com/w.gguf"}
"""

TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec:
  gpu_quota: {h100-80g: 16}
---
apiVersion: llmgw/v1
kind: Team
metadata: {name: ml}
spec:
  organization: acme
  gpu_quota: {h100-80g: 8}
"""


def repo(tmp: Path, models: dict[str, tuple[str, int]], cluster: str = CLUSTER, tenants: str = "") -> Path:
    (tmp / "cluster.yaml").write_text(cluster)
    (tmp / "models").mkdir()
    for name, (extra, min_) in models.items():
        (tmp / "models" / f"{name}.yaml").write_text(MODEL % {"name": name, "extra": extra, "min": min_})
    if tenants:
        (tmp / "tenants.yaml").write_text(tenants)
    return tmp


def validate(path: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["validate", str(path), "--format", "json"])
    return result.exit_code, json.loads(result.output)


def test_a_class_the_cluster_does_not_declare_is_an_error_at_its_line(tmp_path: Path) -> None:
    code, body = validate(repo(tmp_path, {"chat": ("class: critcal", 1)}))
    assert code == 1
    [error] = body["errors"]
    assert error["file"].endswith("models/chat.yaml")
    assert (error["line"], error["path"]) == (6, "spec.class")
    assert "class `critcal` is not one of the Cluster's classes" in error["message"]
    assert error["hint"] == "did you mean `critical`?"


def test_classes_rank_models_and_an_unclassed_model_ranks_last(tmp_path: Path) -> None:
    loaded = load_repo(repo(tmp_path, {"chat": ("class: critical", 1), "misc": ("", 1)}))
    assert loaded.ok and loaded.repo is not None
    views = model_views(loaded.repo.catalog)
    assert (views["chat"].rank, views["misc"].rank) == (0, 2)


def test_without_classes_a_class_is_free_form_and_ranks_nothing(tmp_path: Path) -> None:
    plain = "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: c}\n"
    loaded = load_repo(repo(tmp_path, {"chat": ("class: whatever", 1)}, cluster=plain))
    assert loaded.ok and loaded.repo is not None
    assert model_views(loaded.repo.catalog)["chat"].rank == 0


def test_restart_on_profile_change_is_deprecated_and_maps_onto_the_rollout_block(tmp_path: Path) -> None:
    path = repo(tmp_path, {"chat": ("restart_on_profile_change: true", 1)})
    code, body = validate(path)
    assert code == 0, body
    [warning] = body["warnings"]
    assert warning["path"] == "spec.restart_on_profile_change"
    assert "deprecated" in warning["message"]
    assert warning["hint"] == "write `rollout: {on_change: restart}` instead"
    loaded = load_repo(path)
    assert loaded.repo is not None and loaded.repo.catalog.models["chat"].spec.restarts_on_change


def test_a_rollout_that_cannot_progress_is_an_error(tmp_path: Path) -> None:
    code, body = validate(repo(tmp_path, {"chat": ("rollout: {max_surge: 0, max_unavailable: 0}", 1)}))
    assert code == 1
    [error] = body["errors"]
    assert error["path"] == "spec.rollout" and "max_surge 0 and max_unavailable 0" in error["message"]


def test_a_quota_the_models_minimum_does_not_fit_names_the_quota_and_the_sum(tmp_path: Path) -> None:
    models = {"chat": ("owner: ml", 1), "embed": ("owner: ml", 1), "big": ("owner: acme", 2)}
    code, body = validate(repo(tmp_path, models, tenants=TENANTS))
    assert code == 0, body  # ml: 4 + 4 = 8 of 8; acme: 8 + 8 = 16 of 16
    models["embed"] = ("owner: ml", 2)
    tmp2 = tmp_path / "again"
    tmp2.mkdir()
    code, body = validate(repo(tmp2, models, tenants=TENANTS))
    assert code == 1
    messages = {(e["path"], e["message"]) for e in body["errors"]}
    assert (
        "spec.gpu_quota.h100-80g",
        "Team ml may hold 8 h100-80g, but scaling.min of the models it owns needs 12 with their first "
        "profiles (chat 4, embed 8)",
    ) in messages
    assert any("Organization acme may hold 16 h100-80g" in m and "needs 20" in m for _, m in messages)
    assert all(e["file"].endswith("tenants.yaml") for e in body["errors"])


def test_an_owner_naming_no_tenant_is_a_warning_once_quotas_exist(tmp_path: Path) -> None:
    code, body = validate(repo(tmp_path, {"chat": ("owner: mll", 1)}, tenants=TENANTS))
    assert code == 0
    [warning] = body["warnings"]
    assert warning["path"] == "spec.owner" and "counts against no GPU quota" in warning["message"]
    assert warning["hint"] == "did you mean `ml`?"
