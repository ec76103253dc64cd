"""What a model serves, as the repo says it (docs/router.md, Capabilities): declared capabilities add to its
kind's defaults, `without` takes away, `verified_only` is opt-in per model or per Cluster; validate refuses a
contradiction and prints the effective set, and routers are published that set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.controller.wire.publisher import published_models
from llmgw.core.config.checks.semantic import check
from llmgw.core.config.models import Cluster, Model
from llmgw.core.desired.catalog import Catalog

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"


def model(name: str = "m", **spec: Any) -> Model:
    body = {"context_length": 2048, "profiles": [{"name": "sim", "engine": "sim"}], **spec}
    return Model.model_validate(
        {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name}, "spec": body}
    )


def cluster(**spec: Any) -> Cluster:
    return Cluster.model_validate(
        {"apiVersion": "llmgw/v1", "kind": "Cluster", "metadata": {"name": "c"}, "spec": spec}
    )


def served(**spec: Any) -> list[str]:
    return list(model(**spec).spec.effective_capabilities)


def test_nothing_declared_is_a_chat_model_that_takes_tools() -> None:
    assert served() == ["chat", "completions", "tools"]


def test_declared_capabilities_add_to_the_kinds_defaults() -> None:
    # Declaring tools no longer takes chat away (issue 37: `[tools]` refused plain chat).
    assert served(capabilities=["tools"]) == ["chat", "completions", "tools"]
    assert served(capabilities=["vision"]) == ["chat", "completions", "tools", "vision"]
    assert served(capabilities=["chat", "embeddings"]) == ["chat", "completions", "embeddings", "tools"]
    # Declaring only another kind's endpoint makes a model of that kind.
    assert served(capabilities=["embeddings"]) == ["embeddings"]
    assert served(capabilities=["rerank"]) == ["rerank", "score"]


def test_without_says_what_a_model_lacks() -> None:
    assert served(without=["tools"]) == ["chat", "completions"]
    assert served(capabilities=["vision"], without=["completions"]) == ["chat", "tools", "vision"]
    assert served(capabilities=["rerank", "score"], without=["score"]) == ["rerank"]


def test_validate_refuses_a_contradiction_and_a_model_left_with_no_endpoint() -> None:
    both = [
        e
        for e in check([model(capabilities=["tools"], without=["vision", "tools"])])
        if e.severity == "error"
    ]
    assert [(e.path, e.hint) for e in both] == [(("spec", "without", 1), "keep it in one of the two")]
    assert "`tools` is both declared in `capabilities` and said to be lacking" in both[0].message
    [empty] = [e for e in check([model(without=["chat", "completions"])]) if e.severity == "error"]
    assert empty.path == ("spec", "without") and "serves no endpoint" in empty.message


def test_verified_only_is_opt_in_per_model_or_per_cluster() -> None:
    models = [model("plain"), model("strict", verified_only=True), model("loose", verified_only=False)]
    published = published_models(Catalog.build(models))
    assert {n: m.verified_only for n, m in published.items()} == {
        "plain": False,
        "strict": True,
        "loose": False,
    }
    published = published_models(Catalog.build([cluster(verified_only=True), *models]))
    assert {n: m.verified_only for n, m in published.items()} == {
        "plain": True,
        "strict": True,
        "loose": False,
    }


def test_routers_are_published_the_effective_set_and_what_is_lacking() -> None:
    published = published_models(Catalog.build([model("m", capabilities=["vision"], without=["tools"])]))
    assert published["m"].capabilities == ["chat", "completions", "vision"]
    assert published["m"].without == ["tools"]


def test_validate_prints_the_effective_set() -> None:
    runner = CliRunner()
    text = runner.invoke(app, ["validate", str(EXAMPLE)])
    assert text.exit_code == 0, text.output
    assert "  sim-chat: chat, completions, tools; without vision\n" in text.output
    assert "  gemma-3-270m: chat, completions; without tools, vision\n" in text.output
    assert "  sim-embed: embeddings\n" in text.output
    as_json = runner.invoke(app, ["validate", "-f", "json", str(EXAMPLE)])
    found = json.loads(as_json.output)["capabilities"]
    assert found["sim-chat"] == {
        "capabilities": ["chat", "completions", "tools"],
        "without": ["vision"],
        "verified_only": False,
    }
