"""A llama.cpp profile must be started with the flag that serves each endpoint its model declares."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.core.config.checks.semantic import check
from llmgw.core.config.models import Model


def model(capabilities: list[str], args: dict[str, Any], engine: str = "llamacpp") -> Model:
    return Model.model_validate(
        {
            "apiVersion": "llmgw/v1",
            "kind": "Model",
            "metadata": {"name": "m"},
            "spec": {
                "context_length": 2048,
                "source": {"path": "/models/m.gguf"},
                "capabilities": capabilities,
                "profiles": [{"name": "cpu", "engine": engine, "args": args}],
            },
        }
    )


def messages(doc: Model) -> list[str]:
    return [e.message for e in check([doc]) if e.severity == "error"]


@pytest.mark.parametrize("capability", ["embeddings", "rerank"])
def test_a_declared_capability_needs_its_llama_server_flag(capability: str) -> None:
    [problem] = check([model(["chat", capability], {})])
    assert problem.path == ("spec", "profiles", 0) and problem.severity == "error"
    assert f"declares `{capability}`" in problem.message and f"--{capability}" in problem.message
    assert problem.hint is not None and f"`{capability}: true`" in problem.hint
    assert messages(model(["chat", capability], {capability: False}))  # turned off is not turned on


def test_the_flag_given_or_not_needed_is_clean() -> None:
    assert messages(model(["chat", "embeddings"], {"embeddings": True, "pooling": "mean"})) == []
    assert messages(model(["chat", "rerank"], {"rerank": True})) == []
    assert messages(model(["chat", "completions"], {})) == []  # the defaults need no flag
    assert messages(model(["chat", "embeddings"], {}, engine="sim")) == []  # another engine's own affair
