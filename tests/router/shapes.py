"""The providers' published response schemas, made strict, as validators for what the router sends.

The schemas are OpenAI's and Anthropic's own OpenAPI 3.1 specs, vendored in tests/data/api_schemas (README there:
source package, version, licence). Two things are done to them here, both mechanical:

- OpenAPI's `nullable: true`, which JSON Schema does not know, becomes the null type it means.
- Every object that lists its properties gets `unevaluatedProperties: false`: a field the provider does not
  document is an error, not ignored. A schema used as a part of an `allOf`/`anyOf`/`oneOf` stays open (its
  siblings' fields are legal there); the whole it is part of is closed instead, which JSON Schema 2020-12's
  `unevaluatedProperties` makes exact.

What the router adds on purpose is named in EXTENSIONS, each with why; nothing else passes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DATA = Path(__file__).resolve().parents[1] / "data" / "api_schemas"
SCHEMAS = "#/components/schemas/"
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas")
SUBSCHEMA_ONE = ("items", "additionalProperties", "unevaluatedItems", "contains", "not", "if", "then", "else")
SUBSCHEMA_LISTS = ("prefixItems",)
COMPOSITIONS = ("allOf", "anyOf", "oneOf")

# Fields llmgw adds to a documented object on purpose, as JSON Schema properties, each with its reason.
EXTENSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "openai": {
        # /v1/models cards say what a model serves and how long its context is (docs/router.md): what vLLM's and
        # llama.cpp's cards carry too, and what clients choosing a model read.
        "Model": {
            "context_length": {"type": "integer"},
            "capabilities": {"type": "array", "items": {"type": "string"}},
            "verified_capabilities": {"type": "array", "items": {"type": "string"}},
            # The capability rule (docs/router.md, Capabilities): what a model lacks, what failed its check, and
            # whether it serves only what was verified.
            "without": {"type": "array", "items": {"type": "string"}},
            "failed_capabilities": {"type": "array", "items": {"type": "string"}},
            "verified_only": {"type": "boolean"},
            "aliases": {"type": "array", "items": {"type": "string"}},
            "on_demand": {"type": "boolean"},
            "parent": {"type": "string"},  # a LoRA adapter's base model: vLLM's card says it so
        },
        # A Response says whether it was kept (docs/router.md, stored responses): OpenAI's API does the same,
        # and every Response example in this very spec shows `store`, though its schema leaves it out.
        "Response": {"store": {"type": "boolean"}},
    },
    "anthropic": {},
}


def _with_properties(schema: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`schema` knowing the fields `extra` too: beside its own, or as one more part of its `allOf`."""
    if "properties" in schema:
        return {**schema, "properties": {**schema["properties"], **extra}}
    return {**schema, "allOf": [*schema["allOf"], {"properties": extra}]}


def _derived(provider: str, schemas: dict[str, Any]) -> dict[str, Any]:
    """Shapes the providers document in words but not as a schema of their own, built from their schemas."""
    if provider == "openai":
        # OpenAI's legacy completions stream sends completion objects whose choices have no finish_reason
        # until the last: the API reference's stream chunks for /v1/completions, which the spec does not model.
        chunk = json.loads(json.dumps(schemas["CreateCompletionResponse"]))
        reason = chunk["properties"]["choices"]["items"]["properties"]["finish_reason"]
        reason["type"], reason["enum"] = ["string", "null"], [*reason["enum"], None]
        # And with `stream_options.include_usage`, "all other chunks will also include a usage field, but with a
        # null value" (the spec's own words on stream_options, which /v1/completions takes as chat does).
        chunk["properties"]["usage"] = {"anyOf": [chunk["properties"]["usage"], {"type": "null"}]}
        return {"CreateCompletionResponse.chunk": chunk}
    # Anthropic's streaming guide: a stream may hold `ping` events anywhere, and an `error` event ends a
    # stream that fails after its 200 (the ErrorResponse's shape, sent before any request id is logged).
    error = json.loads(json.dumps(schemas["ErrorResponse"]))
    error["required"] = ["type", "error"]
    ping = {"type": "object", "properties": {"type": {"const": "ping"}}, "required": ["type"]}
    return {"MessageStreamEvent.ping": ping, "MessageStreamEvent.error": error}


@dataclass(frozen=True)
class Shape:
    """One provider's schemas, strict, and the validators for its named response types."""

    provider: str
    source: dict[str, Any]
    registry: Registry[Any]
    contents: dict[
        str, dict[str, Any]
    ]  # "closed" and "open": each schema by name, as the registry holds them
    unions: dict[str, dict[str, str]] = field(default_factory=dict)  # union name → event type → branch name

    def errors(self, name: str, instance: Any) -> list[str]:
        """Every way `instance` is not a `name` (empty: it is one), each with the path where it goes wrong."""
        validator = Draft202012Validator(
            {"$ref": f"urn:{self.provider}#/closed/{name}"}, registry=self.registry
        )
        found = [leaf for error in validator.iter_errors(instance) for leaf in _leaves(error)]
        return sorted({message for e in found if (message := self._describe(name, e, found))})

    def _describe(self, name: str, error: ValidationError, found: list[ValidationError]) -> str | None:
        """The error in words, where it is; None for "unevaluated properties" that only follow from another
        error: a part that fails gives none of its fields' names to the whole, which then calls them unknown.
        A field no part of the schema declares is reported whatever else failed."""
        where = name + ("".join(f"[{p!r}]" for p in error.absolute_path) or "(the body)")
        if error.validator != "unevaluatedProperties" or not isinstance(error.instance, dict):
            return f"{where}: {error.message}"
        here = list(error.absolute_path)
        if not any(e is not error and list(e.absolute_path)[: len(here)] == here for e in found):
            return f"{where}: {error.message}"
        known = self._declared(error.schema)
        unknown = sorted(k for k in error.instance if k not in known)
        return f"{where}: fields the provider does not document: {unknown}" if unknown else None

    def _declared(self, node: Any, depth: int = 0) -> set[str]:
        """Every field name `node` or any part of it (through references) lists."""
        if not isinstance(node, dict) or depth > 50:
            return set()
        names = set(node.get("properties") or ())
        ref = node.get("$ref")
        if isinstance(ref, str):
            kind, _, target = ref.removeprefix(f"urn:{self.provider}").removeprefix("#/").partition("/")
            names |= self._declared(self.contents[kind][target], depth + 1)
        for key in COMPOSITIONS:
            for part in node.get(key) or ():
                names |= self._declared(part, depth + 1)
        return names

    def event_errors(self, union: str, event: Any) -> list[str]:
        """Every way a stream event is not the `union` member its `type` names: checked against that member
        alone, so a mistake is reported where it is, not as "matches none of 50 event types"."""
        branches = self.unions[union]
        kind = event.get("type") if isinstance(event, dict) else None
        if kind not in branches:
            return [
                f"{union}: event type {kind!r} is none of the published ones ({', '.join(sorted(branches))})"
            ]
        return self.errors(branches[kind], event)


def _leaves(error: ValidationError) -> list[ValidationError]:
    """For a value that fits none of a union's members, the errors of the member it meant to be: the one its
    `type` field (or JSON type) does not rule out. Ambiguous, the union's own error stands."""
    if not error.context:
        return [error]
    by_branch: dict[Any, list[ValidationError]] = {}
    for sub in error.context:
        by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)
    meant = [
        subs
        for subs in by_branch.values()
        if not any(
            list(s.relative_path) == ["type"] or (not s.relative_path and s.validator == "type") for s in subs
        )
    ]
    if len(meant) != 1:
        return [best_match([error])]
    return [leaf for sub in meant[0] for leaf in _leaves(sub)]


@cache
def shape(provider: str) -> Shape:
    """The strict schemas of `provider` ("openai" or "anthropic"), built once per test process."""
    document = json.loads((DATA / f"{provider}.json").read_text(encoding="utf-8"))
    schemas: dict[str, Any] = document["components"]["schemas"]
    for name, extra in EXTENSIONS[provider].items():
        schemas[name] = _with_properties(schemas[name], extra)
    schemas.update(_derived(provider, schemas))
    plain = {name: _nullable(schema) for name, schema in schemas.items()}
    strict = _Strict(plain)
    contents = {
        "closed": {name: strict.transform(schema, open_=False) for name, schema in plain.items()},
        "open": {name: strict.transform(schema, open_=True) for name, schema in plain.items()},
    }
    resource: Resource[Any] = DRAFT202012.create_resource(contents)
    registry: Registry[Any] = Registry().with_resource(f"urn:{provider}", resource)
    unions: dict[str, dict[str, str]] = {
        name: _branches(plain, name)
        for name in ("ResponseStreamEvent", "MessageStreamEvent")
        if name in plain
    }
    if provider == "anthropic":
        unions["MessageStreamEvent"].update(ping="MessageStreamEvent.ping", error="MessageStreamEvent.error")
    return Shape(provider, document["x-llmgw-source"], registry, contents, unions)


def _branches(schemas: dict[str, Any], union: str) -> dict[str, str]:
    """A union of event types by its members' `type` values: the published discriminator, read from the schema."""
    out: dict[str, str] = {}
    for branch in schemas[union].get("anyOf") or schemas[union]["oneOf"]:
        name = branch["$ref"].removeprefix(SCHEMAS)
        kind = schemas[name]["properties"]["type"]
        for value in kind.get("enum") or [kind["const"]]:
            out[value] = name
    return out


def _nullable(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` (still used in these 3.1 specs) as the JSON Schema it stands for."""
    if isinstance(node, list):
        return [_nullable(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is not True:
        return out
    if "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]
    if isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
        return out
    return {"anyOf": [out, {"type": "null"}]}


class _Strict:
    """Closes the objects of a set of named schemas (see the module's docstring)."""

    def __init__(self, schemas: dict[str, Any]) -> None:
        self.schemas = schemas

    def transform(self, node: Any, *, open_: bool) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(SCHEMAS):
            # Beside fields or parts of its own, a reference is one part of a whole too.
            part = open_ or any(k in node for k in ("properties", *COMPOSITIONS))
            out["$ref"] = f"#/{'open' if part else 'closed'}/{ref.removeprefix(SCHEMAS)}"
        for key in SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                out[key] = {k: self.transform(v, open_=False) for k, v in node[key].items()}
        for key in SUBSCHEMA_ONE:
            if isinstance(node.get(key), dict):
                out[key] = self.transform(node[key], open_=False)
        for key in SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                out[key] = [self.transform(v, open_=False) for v in node[key]]
        for key in COMPOSITIONS:
            if isinstance(node.get(key), list):
                # A part of a whole: the whole decides which fields are known.
                out[key] = [self.transform(v, open_=True) for v in node[key]]
        if not open_ and self._closable(node):
            out["unevaluatedProperties"] = False
        return out

    def _closable(self, node: dict[str, Any]) -> bool:
        """Whether the objects `node` admits all list their fields: then any other field is an error."""
        if any(k in node for k in ("additionalProperties", "unevaluatedProperties", "patternProperties")):
            return False  # the schema says itself what else may be there
        parts = [self._resolve(p) for key in COMPOSITIONS for p in node.get(key) or []]
        if isinstance(node.get("$ref"), str):
            parts.append(self._resolve(node))
        if any(self._free_form(p) for p in parts):
            return False
        return "properties" in node or any(self._lists_fields(p) for p in parts)

    def _resolve(self, node: Any) -> Any:
        seen = 0
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and seen < 50:
            node = self.schemas[node["$ref"].removeprefix(SCHEMAS)]
            seen += 1
        return node

    def _free_form(self, node: Any) -> bool:
        """An object with no fields listed, or a map: any field may be there."""
        if not isinstance(node, dict):
            return node is True
        types = node.get("type")
        objectish = types == "object" or (isinstance(types, list) and "object" in types)
        if objectish and not any(k in node for k in ("properties", *COMPOSITIONS)):
            return True
        if any(k in node for k in ("additionalProperties", "patternProperties")):
            return node.get("additionalProperties") is not False
        return any(self._free_form(self._resolve(p)) for key in COMPOSITIONS for p in node.get(key) or [])

    def _lists_fields(self, node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if "properties" in node:
            return True
        return any(self._lists_fields(self._resolve(p)) for key in COMPOSITIONS for p in node.get(key) or [])
