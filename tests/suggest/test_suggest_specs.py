"""`llmgw validate` on service objectives and prices (issue 50): each mistake at its file:line with what would
be right; a project's objectives replace the model's for what they set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.core.config.models import Slo

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: c}
spec:
  gpu_classes: {l4-24g: {memory_gb: 24}, h100-80g: {memory_gb: 80}}
  costs:
%(costs)s
"""

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: chat}
spec:
  context_length: 4096
  slo:
%(slo)s
  profiles:
    - {name: gpu, engine: vllm, gpu_class: h100-80g, gpus: 1}
    - {name: cpu, engine: llamacpp, node_selector: {llmgw.io/kind: c7}}
  source: {url: "https://example.com/w.gguf"}
---
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: search}
spec: {organization: acme}
"""

GOOD_SLO = "    ttft_p99_ms: 800"
GOOD_COSTS = "    gpu_per_hour: {h100-80g: 2.5, l4-24g: 0.7}\n    cpu_node_per_hour: {c7: 0.3}"


def validate(tmp: Path, slo: str = GOOD_SLO, costs: str = GOOD_COSTS) -> tuple[int, list[dict[str, Any]]]:
    (tmp / "cluster.yaml").write_text(CLUSTER % {"costs": costs})
    (tmp / "models").mkdir(exist_ok=True)
    (tmp / "models" / "chat.yaml").write_text(MODEL % {"slo": slo})
    result = CliRunner().invoke(app, ["validate", str(tmp), "--format", "json"])
    body = json.loads(result.output)
    return result.exit_code, body["errors"] + body.get("warnings", [])


def test_objectives_and_prices_that_fit_validate(tmp_path: Path) -> None:
    slo = GOOD_SLO + "\n    ttft_p90_ms: 300\n    tpot_p99_ms: 60\n    availability: 0.999"
    slo += "\n    projects: {search: {ttft_p99_ms: 400}}"
    code, issues = validate(tmp_path, slo)
    assert code == 0, issues
    assert issues == []


@pytest.mark.parametrize(
    ("slo", "path", "words"),
    [
        (GOOD_SLO + "\n    ttft_p90_ms: 900", "spec.slo", "ttft_p90_ms 900 is above ttft_p99_ms 800"),
        (GOOD_SLO + "\n    availability: 1.5", "spec.slo.availability", "must be at most 1"),
        (GOOD_SLO + "\n    tpot_p99_ms: 0", "spec.slo.tpot_p99_ms", "must be more than 0"),
        (GOOD_SLO + "\n    projects: {search: {}}", "spec.slo", "projects.search sets no objective"),
        ("    tpot_p99_ms: 50", "spec.slo", "missing required key `ttft_p99_ms`"),
    ],
)
def test_an_objective_out_of_shape_is_an_error_at_its_line(
    tmp_path: Path, slo: str, path: str, words: str
) -> None:
    code, issues = validate(tmp_path, slo)
    assert code == 1
    [error] = issues
    assert error["file"].endswith("models/chat.yaml")
    assert error["path"] == path
    assert words in error["message"]


def test_a_project_the_repo_does_not_declare_is_named_with_a_guess(tmp_path: Path) -> None:
    code, issues = validate(tmp_path, GOOD_SLO + "\n    projects: {serch: {ttft_p99_ms: 400}}")
    assert code == 1
    [error] = issues
    assert error["path"] == "spec.slo.projects.serch"
    assert error["message"] == "no Project `serch`"
    assert error["hint"] == "did you mean `search`?"


def test_a_price_for_an_undeclared_class_is_an_error_naming_the_declared_ones(tmp_path: Path) -> None:
    code, issues = validate(tmp_path, costs="    gpu_per_hour: {h100-80gb: 2.5}")
    assert code == 1
    [error] = issues
    assert error["file"].endswith("cluster.yaml")
    assert "costs.gpu_per_hour prices h100-80gb, not among gpu_classes (h100-80g, l4-24g)" in error["message"]


def test_a_negative_price_or_a_lowercase_currency_is_refused(tmp_path: Path) -> None:
    code, issues = validate(tmp_path, costs="    gpu_per_hour: {h100-80g: -1}")
    assert code == 1 and issues[0]["path"] == "spec.costs.gpu_per_hour.h100-80g"
    code, issues = validate(tmp_path, costs="    currency: usd")
    assert code == 1 and issues[0]["path"] == "spec.costs.currency"


def test_an_unpriced_class_or_kind_warns_once_prices_are_declared(tmp_path: Path) -> None:
    code, issues = validate(tmp_path, costs="    gpu_per_hour: {l4-24g: 0.7}")
    assert code == 0
    assert {(i["path"], i["severity"]) for i in issues} == {
        ("spec.profiles[0].gpu_class", "warning"),
        ("spec.profiles[1].node_selector", "warning"),
    }
    assert "GPU class `h100-80g` has no price" in issues[0]["message"] + issues[1]["message"]
    code, issues = validate(
        tmp_path, costs="    default_gpu_per_hour: 1.0\n    default_cpu_node_per_hour: 0.2"
    )
    assert (code, issues) == (0, [])


def test_a_projects_objectives_replace_the_models_for_what_they_set() -> None:
    slo = Slo(ttft_p99_ms=800, tpot_p99_ms=60, projects={"search": {"ttft_p99_ms": 400}})
    assert slo.for_project("search") == {"ttft_p99_ms": 400, "tpot_p99_ms": 60}
    assert slo.for_project("other") == slo.for_project(None) == {"ttft_p99_ms": 800, "tpot_p99_ms": 60}
