"""`llmgw plan` says which replicas will carry which LoRA adapters (docs/lora.md), in text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.adapters.repo_files import load_repo
from llmgw.core.fleet.views import LiveState
from llmgw.core.plan import plan_for_catalog, render_json, render_text

REPO = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: gemma}
spec:
  context_length: 2048
  source: {path: /models/gemma.gguf}
  profiles: [{name: cpu, engine: llamacpp}]
---
apiVersion: llmgw/v1
kind: Adapter
metadata: {name: gemma-support}
spec: {base: gemma, source: {path: /adapters/support.gguf}}
---
apiVersion: llmgw/v1
kind: Adapter
metadata: {name: gemma-legal}
spec: {base: gemma, source: {path: /adapters/legal.gguf}}
"""


def test_the_plan_lists_each_bases_adapters_and_their_replicas(tmp_path: Path) -> None:
    (tmp_path / "repo.yaml").write_text(REPO)
    loaded = load_repo(tmp_path, revision="abc")
    assert loaded.catalog is not None, [str(e) for e in loaded.errors]
    plan = plan_for_catalog(loaded.catalog, LiveState(revision=None, models={}))
    (carry,) = plan.adapters
    assert (carry.model, carry.adapters, carry.replicas) == ("gemma", ("gemma-legal", "gemma-support"), ())
    text = render_text(plan)
    assert "Adapters (each replica of the base loads them at start):" in text
    assert "  = gemma: gemma-legal, gemma-support on no replica yet" in text
    assert json.loads(render_json(plan))["adapters"] == [
        {"model": "gemma", "adapters": ["gemma-legal", "gemma-support"], "replicas": []}
    ]


def test_an_added_adapter_and_a_changed_response_cache_are_document_changes(tmp_path: Path) -> None:
    from llmgw.core.plan import catalog_documents

    base = REPO.split("---\n")[0]
    project = "apiVersion: llmgw/v1\nkind: Organization\nmetadata: {name: acme}\n---\n"
    project += "apiVersion: llmgw/v1\nkind: Project\nmetadata: {name: bot}\nspec:\n  organization: acme\n"
    (tmp_path / "repo.yaml").write_text(base + "---\n" + project)
    before = load_repo(tmp_path, revision="a").catalog
    assert before is not None
    cached = project + "  response_cache: {ttl: 10m}\n"
    (tmp_path / "repo.yaml").write_text(REPO + "---\n" + cached)
    after = load_repo(tmp_path, revision="b").catalog
    assert after is not None
    live = LiveState(
        revision="a",
        models={n: m.spec for n, m in before.models.items()},
        documents=catalog_documents(before),
    )
    plan = plan_for_catalog(after, live)
    changes = {(d.kind, d.name, d.change) for d in plan.documents}
    assert {("Adapter", "gemma-legal", "add"), ("Adapter", "gemma-support", "add")} <= changes
    assert ("Project", "bot", "change") in changes
