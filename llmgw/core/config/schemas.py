"""JSON Schemas of the cluster repo, generated from the pydantic models (pure: values in, values out).

One schema per kind (`model.schema.json`, ...) and one combined schema (`cluster-repo.schema.json`) for files
holding documents of several kinds. `llmgw schemas write` commits them to schemas/; a test fails when stale.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from llmgw.core.config.models import DOCUMENT_KINDS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
ID_BASE = "https://llmgw.dev/schemas/v1/"
COMBINED = "cluster-repo"


def schema_file_name(kind: str) -> str:
    """`Model` -> `model.schema.json`, `RoutingPolicy` -> `routingpolicy.schema.json`."""
    return f"{kind.lower()}.schema.json"


def _without_titles(node: Any) -> Any:
    # pydantic's generated titles ("Context Length") only restate the key; editors show descriptions instead.
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "title" and isinstance(value, str):
                continue
            if key in ("properties", "$defs") and isinstance(value, dict):
                out[key] = {name: _without_titles(sub) for name, sub in value.items()}
            else:
                out[key] = _without_titles(value)
        return out
    if isinstance(node, list):
        return [_without_titles(item) for item in node]
    return node


def kind_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one kind of document."""
    model = DOCUMENT_KINDS[kind]
    raw = model.model_json_schema(by_alias=True, mode="validation")
    body = _without_titles(raw)
    return {
        "$schema": DRAFT,
        "$id": ID_BASE + schema_file_name(kind),
        "title": f"llmgw {kind}",
        **{key: value for key, value in body.items() if key != "$defs"},
        **({"$defs": body["$defs"]} if "$defs" in body else {}),
    }


def combined_schema() -> dict[str, Any]:
    """One schema accepting a document of any kind, chosen by its `kind` (for files mixing kinds)."""
    defs: dict[str, Any] = {}
    branches = []
    for kind in DOCUMENT_KINDS:
        schema = kind_schema(kind)
        for name, sub in schema.get("$defs", {}).items():
            if name in defs and defs[name] != sub:
                raise AssertionError(f"two different definitions named {name}")  # a model naming bug
            defs[name] = sub
        defs[kind] = {
            key: value for key, value in schema.items() if key not in ("$schema", "$id", "$defs", "title")
        }
        branches.append(
            {
                "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                "then": {"$ref": f"#/$defs/{kind}"},
            }
        )
    return {
        "$schema": DRAFT,
        "$id": ID_BASE + f"{COMBINED}.schema.json",
        "title": "llmgw cluster repo document",
        "description": "Any document of the cluster repo; the `kind` chooses its schema.",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {"kind": {"enum": list(DOCUMENT_KINDS)}},
        "allOf": branches,
        "$defs": dict(sorted(defs.items())),
    }


def all_schemas() -> dict[str, dict[str, Any]]:
    """File name -> schema, for every file `llmgw schemas write` produces."""
    out = {schema_file_name(kind): kind_schema(kind) for kind in DOCUMENT_KINDS}
    out[f"{COMBINED}.schema.json"] = combined_schema()
    return out


def render(schema: dict[str, Any]) -> str:
    """The committed text of a schema file (stable, so the staleness test compares text)."""
    return json.dumps(copy.deepcopy(schema), indent=2, ensure_ascii=False) + "\n"
