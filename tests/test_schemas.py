"""schemas/ and docs/cluster-repo.md are generated and committed: stale files fail here. The schemas are real:
every example file validates against them with plain `jsonschema`, and they refuse a typo."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from llmgw.core.config.docs import render_reference
from llmgw.core.config.schemas import all_schemas, render

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "schemas"
EXAMPLE = ROOT / "examples" / "cluster-repo"
# Cluster documents only: dot-files and dot-directories (.github workflows, .pre-commit-config.yaml) are
# tooling the loader skips too.
EXAMPLE_FILES = sorted(
    p
    for p in EXAMPLE.rglob("*.yaml")
    if not any(part.startswith(".") for part in p.relative_to(EXAMPLE).parts)
)
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")
REGENERATE = "stale: run `make schemas` (llmgw schemas write && llmgw schemas docs) and commit the result"


def test_committed_schemas_are_current() -> None:
    expected = all_schemas()
    assert sorted(p.name for p in SCHEMAS.glob("*.json")) == sorted(expected), REGENERATE
    for name, schema in expected.items():
        assert (SCHEMAS / name).read_text(encoding="utf-8") == render(schema), (
            f"schemas/{name} is {REGENERATE}"
        )


def test_committed_reference_is_current() -> None:
    text = (ROOT / "docs" / "cluster-repo.md").read_text(encoding="utf-8")
    assert text == render_reference(), f"docs/cluster-repo.md is {REGENERATE}"


@pytest.mark.parametrize("name", sorted(all_schemas()))
def test_schemas_are_draft_2020_12_and_closed(name: str) -> None:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith("/" + name) and schema["title"]
    Draft202012Validator.check_schema(schema)

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            # The combined schema's root only dispatches on `kind`; each kind's branch is closed.
            dispatcher = where == "#" and name == "cluster-repo.schema.json"
            if "properties" in node and node.get("type") == "object" and not dispatcher:
                assert node.get("additionalProperties") is False, f"{name}: {where} is open"
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    walk(schema, "#")


def test_example_repo_has_every_kind() -> None:
    kinds = {
        doc["kind"] for path in EXAMPLE_FILES for doc in YAML(typ="safe").load_all(path.read_text()) if doc
    }
    assert kinds == {"Cluster", "Node", "Model", "RoutingPolicy", "Organization", "Team", "Project"}


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[str(p.relative_to(EXAMPLE)) for p in EXAMPLE_FILES])
def test_example_files_validate_with_plain_jsonschema(path: Path) -> None:
    first_line = path.read_text(encoding="utf-8").splitlines()[0]
    match = MODELINE.match(first_line)
    assert match, f"{path} must start with a yaml-language-server $schema line"
    schema_path = (path.parent / match.group(1)).resolve()
    assert schema_path.parent == SCHEMAS.resolve()
    validator = Draft202012Validator(json.loads(schema_path.read_text(encoding="utf-8")))
    documents = [d for d in YAML(typ="safe").load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert documents
    for document in documents:
        errors = [e.message for e in validator.iter_errors(document)]
        assert errors == [], f"{path}: {errors}"
        combined = Draft202012Validator(json.loads((SCHEMAS / "cluster-repo.schema.json").read_text()))
        assert list(combined.iter_errors(document)) == []


def test_schemas_refuse_typos_and_literal_secrets() -> None:
    model = json.loads((SCHEMAS / "model.schema.json").read_text())
    combined = json.loads((SCHEMAS / "cluster-repo.schema.json").read_text())
    doc = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"}, "spec": {"contxt_length": 1}}
    for schema in (model, combined):
        assert not Draft202012Validator(schema).is_valid(doc)
    cluster = {
        "apiVersion": "llmgw/v1",
        "kind": "Cluster",
        "metadata": {"name": "c"},
        "spec": {"secret": "hunter2"},
    }
    assert not Draft202012Validator(combined).is_valid(cluster)
    cluster["spec"] = {"secret": {"env": "LLMGW_SECRET"}}
    assert Draft202012Validator(combined).is_valid(cluster)


def test_schemas_commands_write_what_is_committed(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmgw.cli.main import app

    runner = CliRunner()
    assert runner.invoke(app, ["schemas", "write", str(tmp_path / "schemas")]).exit_code == 0
    assert runner.invoke(app, ["schemas", "docs", str(tmp_path / "ref.md")]).exit_code == 0
    for committed in SCHEMAS.glob("*.json"):
        assert (tmp_path / "schemas" / committed.name).read_text() == committed.read_text()
    assert (tmp_path / "ref.md").read_text() == (ROOT / "docs" / "cluster-repo.md").read_text()
