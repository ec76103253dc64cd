"""`llmgw validate` on facilities and capacity: warnings where a setting does nothing, errors where two say the
same thing differently; each at its file:line, saying what would be right."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from llmgw.cli.main import app

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: c}
spec:
  gpu_classes: {h100-80g: {memory_gb: 80%(watts)s}}
  facilities:
    power_caps: {pdu=a1: 17000, pdu=b9: 9000}
"""

NODE = """\
apiVersion: llmgw/v1
kind: Node
metadata:
  name: n1
  labels: {llmgw.io/rack: r1, llmgw.io/pdu: a1}
spec: {address: 10.0.0.1}
"""

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: chat}
spec:
  context_length: 4096
  owner: ml
  source: {url: "https://example.com/w.gguf"}
  profiles:
    - {name: one, engine: vllm, gpu_class: h100-80g, gpus: 1, keep_within: rack}
    - {name: two, engine: vllm, gpu_class: h100-80g, gpus: 1, tp: 2, nodes: 2, keep_within: rack}
"""

TEAM = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
---
apiVersion: llmgw/v1
kind: Team
metadata: {name: ml}
spec:
  organization: acme
  gpu_quota: {h100-80g: 8}
  capacity: {h100-80g: {guaranteed: {gpus: 2}, limit: {gpus: 4}}}
"""


def validate(tmp: Path, watts: str = "", team: str = "") -> tuple[int, list[dict]]:
    (tmp / "cluster.yaml").write_text(CLUSTER % {"watts": watts})
    (tmp / "node.yaml").write_text(NODE)
    (tmp / "model.yaml").write_text(MODEL)
    if team:
        (tmp / "team.yaml").write_text(team)
    result = CliRunner().invoke(app, ["validate", str(tmp), "--format", "json"])
    body = json.loads(result.output)
    return result.exit_code, [*body["errors"], *body.get("warnings", [])]


def test_settings_that_do_nothing_are_warned_of_where_they_are(tmp_path: Path) -> None:
    code, issues = validate(tmp_path)
    assert code == 0, issues
    by_path = {i["path"]: i for i in issues}
    one = by_path["spec.profiles[0].keep_within"]
    assert one["file"].endswith("model.yaml") and one["line"] == 9
    assert "this profile runs on one node" in one["message"]
    assert "spec.profiles[1].keep_within" not in by_path
    cap = by_path['spec.facilities.power_caps["pdu=b9"]']
    assert "no Node document carries llmgw.io/pdu: b9" in cap["message"]
    assert 'spec.facilities.power_caps["pdu=a1"]' not in by_path
    assert "count only the draw agents measure" in by_path["spec.facilities.power_caps"]["message"]
    # With a class's watts declared, the caps have something to count.
    _, issues = validate(tmp_path, watts=", watts: 700")
    assert "spec.facilities.power_caps" not in {i["path"] for i in issues}


def test_a_gpu_limit_given_twice_is_an_error(tmp_path: Path) -> None:
    code, issues = validate(tmp_path, watts=", watts: 700", team=TEAM)
    assert code == 1
    [error] = [i for i in issues if i["path"] == "spec.capacity.h100-80g.limit.gpus"]
    assert "h100-80g's GPU limit is given twice: gpu_quota says 8, capacity says 4" in error["message"]
    assert error["hint"] == "keep capacity.h100-80g.limit.gpus and drop gpu_quota.h100-80g"
