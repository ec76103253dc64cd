"""OpenAPI 3.1 from a table of endpoints: each names its method, path, query parameters, body model, answer
models, error answers and the scope its token needs; the models' JSON Schemas (pydantic's, JSON Schema 2020-12,
which OpenAPI 3.1 takes as it is) land under components/schemas.

Pure: the controller's route table (llmgw.controller.api.routes) hands its endpoints here, and the same
document is committed (docs/admin-openapi.json, `llmgw schemas openapi`) and served (/api/v1/openapi.json).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from llmgw.core.api.admin_api import ErrorAnswer

__all__ = [
    "Auth",
    "Endpoint",
    "Query",
    "document",
    "render",
]

JsonObject = dict[str, Any]
Auth = Literal["plan", "apply", "admin", "router", "none"]
REF = "#/components/schemas/{model}"
ADMIN_TOKEN = "adminToken"
ROUTER_TOKEN = "routerToken"
SCOPE_WORDS = {
    "plan": "reads",
    "apply": "reads and applies revisions",
    "admin": "everything, API keys and credentials included",
}


@dataclass(frozen=True, slots=True)
class Query:
    """One query parameter: its JSON Schema and what it means."""

    name: str
    schema: JsonObject
    description: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What an admin endpoint reads and answers with, and who may call it.

    `auth`: the token's scope (plan, apply, admin), `router` (a router's token or an admin one), or `none` (the
    webhook: it trusts nothing it is sent). `answers`: success status -> model; `errors`: status -> when.
    `streams`: another media type the 200 may be (a followed log is NDJSON). `body_optional`: no body is read as
    the model's defaults. `path_schemas`: a path parameter's schema when it is more than a non-empty string.
    """

    method: str
    path: str
    auth: Auth
    summary: str
    answers: Mapping[int, type[BaseModel]]
    errors: Mapping[int, str] = field(default_factory=dict)
    body: type[BaseModel] | None = None
    query: tuple[Query, ...] = ()
    streams: str | None = None
    body_optional: bool = False
    path_schemas: Mapping[str, JsonObject] = field(default_factory=dict)  # a path parameter's own schema

    @property
    def operation_id(self) -> str:
        words = re.sub(r"[^a-z0-9]+", "_", self.path.removeprefix("/api/v1/").lower()).strip("_")
        return f"{self.method.lower()}_{words}"


def _schemas(
    endpoints: Iterable[Endpoint],
) -> tuple[dict[tuple[type[BaseModel], str], JsonObject], JsonObject]:
    wanted: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {(ErrorAnswer, "serialization"): None}
    for e in endpoints:
        if e.body is not None:
            wanted[(e.body, "validation")] = None
        for model in e.answers.values():
            wanted[(model, "serialization")] = None
    # By field name, not alias: the handlers answer with model_dump(mode="json"), which writes `model_class`
    # where a repo's YAML says `class` (the config models take both). No body model has an alias.
    refs, defs = models_json_schema(list(wanted), by_alias=False, ref_template=REF)
    by_model: dict[tuple[type[BaseModel], str], JsonObject] = {}
    for (kind, mode), ref in refs.items():
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            by_model[(kind, mode)] = dict(ref)
    return by_model, defs.get("$defs", {})


def _json(schema: JsonObject) -> JsonObject:
    return {"application/json": {"schema": schema}}


def _security(auth: Auth) -> list[JsonObject]:
    if auth == "none":
        return [{}]
    if auth == "router":
        return [{ROUTER_TOKEN: []}, {ADMIN_TOKEN: ["admin"]}]
    return [{ADMIN_TOKEN: [auth]}]


def _operation(e: Endpoint, refs: Mapping[tuple[type[BaseModel], str], JsonObject]) -> JsonObject:
    error_ref = refs[(ErrorAnswer, "serialization")]
    responses: JsonObject = {}
    for status, model in sorted(e.answers.items()):
        content = _json(refs[(model, "serialization")])
        if e.streams is not None:
            content[e.streams] = {"schema": {"type": "string", "description": "One JSON object a line"}}
        responses[str(status)] = {"description": model.__doc__ or model.__name__, "content": content}
    errors = dict(e.errors)
    if e.auth != "none":
        errors.setdefault(401, "No token, or one this controller does not know")
    if e.auth in SCOPE_WORDS:
        errors.setdefault(403, f"The token's scope is below {e.auth}")
    for status, words in sorted(errors.items()):
        responses[str(status)] = {"description": words, "content": _json(error_ref)}
    parameters: list[JsonObject] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": e.path_schemas.get(name, {"type": "string", "minLength": 1}),
        }
        for name in re.findall(r"{(\w+)}", e.path)
    ]
    parameters += [
        {
            "name": q.name,
            "in": "query",
            "required": q.required,
            "description": q.description,
            "schema": q.schema,
        }
        for q in e.query
    ]
    op: JsonObject = {
        "operationId": e.operation_id,
        "summary": e.summary,
        "security": _security(e.auth),
        "x-llmgw-auth": e.auth,
    }
    if parameters:
        op["parameters"] = parameters
    if e.body is not None:
        op["requestBody"] = {"required": not e.body_optional, "content": _json(refs[(e.body, "validation")])}
    op["responses"] = responses
    return op


def document(endpoints: Iterable[Endpoint]) -> JsonObject:
    """The OpenAPI 3.1 document of `endpoints`, in their order."""
    listed = list(endpoints)
    refs, defs = _schemas(listed)
    paths: JsonObject = {}
    for e in listed:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e, refs)
    scopes = "; ".join(f"{s}: {w}" for s, w in SCOPE_WORDS.items())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llmgw controller admin API",
            "version": "1",
            "description": "Generated from the controller's route table (llmgw.controller.api.routes): "
            "`llmgw schemas openapi` writes it, GET /api/v1/openapi.json serves it. See docs/controller.md.",
        },
        "paths": paths,
        "components": {
            "schemas": defs,
            "securitySchemes": {
                ADMIN_TOKEN: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": f"An admin token; the operation's list names the scope it needs ({scopes})",
                },
                ROUTER_TOKEN: {"type": "http", "scheme": "bearer", "description": "A router's token"},
            },
        },
    }


def render(doc: JsonObject) -> str:
    """The committed text: stable (keys in insertion order, two-space indent), one newline at the end."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
