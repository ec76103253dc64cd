"""Per-document validation: the document's shape, then JSON Schema, then pydantic.

Every JSON Schema error is rewritten into a message a person can act on, at the position of the offending key
or value. pydantic runs only on documents the schema accepted, so one mistake is never reported twice; it
catches what a schema cannot say (or says less clearly).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaError, best_match
from pydantic import BaseModel, ValidationError as PydanticError

from llmgw.core.config.errors import ConfigError, PathPart, format_path
from llmgw.core.config.models import API_VERSION, DOCUMENT_KINDS, NAME_PATTERN
from llmgw.core.config.yamlpos import ParsedDocument
from llmgw.core.words import DURATION_PATTERN

Path = tuple[PathPart, ...]
SECRET_HINT = "write `{env: NAME}` or `{file: PATH}`"
_PATTERN_HINTS = {
    NAME_PATTERN: "use lower-case letters, digits, `.`, `_` and `-`, starting and ending with a letter or digit",
    DURATION_PATTERN: "write a whole number and a unit (ms, s, m, h, d, w): 500ms, 30s, 10m, 1h, 30d, 2w",
    r"^[0-9a-f]{64}$": "write 64 lower-case hexadecimal digits",
}
_JSON_TYPES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "nothing (null)",
}


def make_validators(schemas: Mapping[str, Mapping[str, Any]]) -> dict[str, Draft202012Validator]:
    """Kind -> validator, from `{kind: schema}`."""
    return {kind: Draft202012Validator(dict(schema)) for kind, schema in schemas.items()}


def written(value: Any, limit: int = 40) -> str:
    """A value as it would be written, shortened for a message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class DocumentChecker:
    """Checks one parsed document at a time against the schemas of every kind."""

    def __init__(self, validators: Mapping[str, Draft202012Validator]) -> None:
        self.validators = validators

    def check(self, doc: ParsedDocument) -> tuple[BaseModel | None, list[ConfigError]]:
        errors: list[ConfigError] = []

        def report(path: Path, message: str, hint: str | None = None, *, at_key: bool = False) -> None:
            pos = doc.positions.key(path) if at_key else doc.positions.value(path)
            errors.append(ConfigError(doc.file, pos.line, pos.col, format_path(path), message, hint))

        data = doc.data
        if not isinstance(data, dict):
            report(
                (),
                f"a document must be a mapping, not {_JSON_TYPES[_json_type(data)]}",
                "start it with `apiVersion: llmgw/v1`, `kind`, `metadata: {name: ...}` and `spec`",
            )
            return None, errors
        kind = data.get("kind")
        if kind is None:
            report((), "document has no `kind`", f"add `kind:` with one of {', '.join(DOCUMENT_KINDS)}")
            return None, errors
        if not isinstance(kind, str) or kind not in DOCUMENT_KINDS:
            hint = did_you_mean(kind, DOCUMENT_KINDS) if isinstance(kind, str) else None
            report(
                ("kind",), f"unknown kind {written(kind)}", hint or f"use one of {', '.join(DOCUMENT_KINDS)}"
            )
            return None, errors
        validator = self.validators[kind]
        for error in validator.iter_errors(data):
            self._schema_error(error, report)
        if errors:
            return None, errors
        try:
            return DOCUMENT_KINDS[kind].model_validate(data), errors
        except PydanticError as exc:
            for item in exc.errors(include_url=False):
                message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
                report(tuple(item.get("loc", ())), message)
            return None, errors

    def _schema_error(self, error: SchemaError, report: Any) -> None:
        path: Path = tuple(error.absolute_path)
        keyword: Any = error.validator
        value: Any = error.validator_value
        instance: Any = error.instance
        schema = error.schema if isinstance(error.schema, dict) else {}
        if "propertyNames" in error.schema_path:
            allowed = value if keyword == "enum" else []
            report(
                (*path, str(instance)),
                f"unknown key `{instance}`",
                did_you_mean(str(instance), allowed)
                or (f"use one of {', '.join(allowed)}" if allowed else None),
                at_key=True,
            )
        elif keyword == "additionalProperties" and isinstance(instance, dict):
            known = list(schema.get("properties", {}))
            for key in instance:
                if key not in known:
                    hint = did_you_mean(key, known) or (
                        f"allowed keys: {', '.join(known)}" if known else "this mapping takes no keys"
                    )
                    report((*path, key), f"unknown key `{key}`", hint, at_key=True)
        elif keyword == "required" and isinstance(instance, dict):
            known = schema.get("properties", {})
            unknown = [k for k in instance if k not in known]
            for key in value:
                # A misspelt key is already reported as unknown, with the right spelling; say it once.
                if key not in instance and not did_you_mean(key, unknown):
                    report(path, f"missing required key `{key}`", _required_hint(key), at_key=True)
        elif keyword in ("anyOf", "oneOf"):
            self._alternatives(error, path, report)
        elif keyword == "type":
            if _is_secret_schema(schema) and isinstance(instance, str):
                report(path, "a secret must not be written literally", SECRET_HINT)
            else:
                expected = value if isinstance(value, list) else [value]
                want = " or ".join(str(_JSON_TYPES.get(str(t), t)) for t in expected)
                report(path, f"expected {want}, got {_JSON_TYPES[_json_type(instance)]} {written(instance)}")
        elif keyword == "enum":
            choices = [str(c) for c in value]
            close = did_you_mean(str(instance), choices) if isinstance(instance, str) else None
            report(path, f"{written(instance)} is not one of: {', '.join(choices)}", close)
        elif keyword == "const":
            report(path, f"must be {written(value)}, not {written(instance)}", f"write {written(value)}")
        elif keyword == "pattern":
            hint = _PATTERN_HINTS.get(value, f"it must match {value}")
            report(path, f"{written(instance)} is not a valid value here", hint)
        elif keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            words = {
                "minimum": "at least",
                "maximum": "at most",
                "exclusiveMinimum": "more than",
                "exclusiveMaximum": "less than",
            }
            report(path, f"{written(instance)} is out of range: must be {words[keyword]} {value}")
        else:
            report(path, error.message[:200])

    def _alternatives(self, error: SchemaError, path: Path, report: Any) -> None:
        branches = error.validator_value if isinstance(error.validator_value, list) else []
        instance = error.instance
        secret = _is_secret_schema(error.schema if isinstance(error.schema, dict) else {}) or any(
            str(b.get("$ref", "")).endswith("/SecretRef") for b in branches if isinstance(b, dict)
        )
        if secret and isinstance(instance, str):
            report(path, "a secret must not be written literally", SECRET_HINT)
            return
        required = [b["required"][0] for b in branches if isinstance(b, dict) and list(b) == ["required"]]
        if required and len(required) == len(branches) and isinstance(instance, dict):
            present = [key for key in required if key in instance]
            names = " or ".join(f"`{key}`" for key in required)
            if not present:
                report(path, f"needs one of {names}", None, at_key=True)
            else:
                report(
                    (*path, present[1]), f"takes only one of {names}", f"remove `{present[1]}`", at_key=True
                )
            return
        # `X | None` fields: explain every mismatch against X, not against null.
        real = [i for i, b in enumerate(branches) if not (isinstance(b, dict) and b.get("type") == "null")]
        context = list(error.context or [])
        if len(real) == 1 and instance is not None:
            own = [
                sub for sub in context if sub.relative_schema_path and sub.relative_schema_path[0] == real[0]
            ]
            for sub in own:
                self._schema_error(sub, report)
            if own:
                return
        best = best_match(context) if context else None
        if best is not None:
            self._schema_error(best, report)
        else:
            report(path, error.message[:200])


def _is_secret_schema(schema: Mapping[str, Any]) -> bool:
    props = schema.get("properties")
    return isinstance(props, dict) and set(props) == {"file", "env"}


def _required_hint(key: str) -> str | None:
    if key == "apiVersion":
        return f"add `apiVersion: {API_VERSION}`"
    if key == "metadata":
        return "add `metadata: {name: ...}`"
    if key == "address":
        return "add the host name or IP address, or `local: true` for the machine llmgw runs on"
    return None
