"""YAML text -> plain JSON-like documents, with the line and column of every key and value.

ruamel.yaml's round-trip loader keeps positions; we copy each document into plain dicts, lists and scalars (what
JSON Schema and pydantic expect) and keep a table from the path of every node to where it was written. Anything
JSON cannot hold (non-string keys, binary, sets, tags, NaN, integers too large) is reported here, at its position,
instead of surprising a later stage. Pure: takes bytes, returns values, never raises.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import TaggedScalar
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from llmgw.core.config.errors import ConfigError, PathPart, format_path
from llmgw.core.errors import LlmgwError

Path = tuple[PathPart, ...]
# Alias expansion can make a small file huge (the "billion laughs"); no real cluster repo document comes close.
MAX_NODES = 200_000
_MAX_INT = 2**63


@dataclass(frozen=True)
class Position:
    line: int  # 1-based
    col: int  # 1-based


@dataclass
class Positions:
    """Where each node of one document was written; lookups fall back to the nearest enclosing node."""

    start: Position
    keys: dict[Path, Position] = field(default_factory=dict)
    values: dict[Path, Position] = field(default_factory=dict)

    def value(self, path: Path) -> Position:
        for end in range(len(path), -1, -1):
            found = self.values.get(path[:end])
            if found is not None:
                return found
        return self.start

    def key(self, path: Path) -> Position:
        """The key's position for a mapping entry (the value's for a list item or the document)."""
        return self.keys.get(path) or self.value(path)


@dataclass
class ParsedDocument:
    file: str
    index: int  # position of the document in its file, from 0
    data: Any  # plain dict/list/str/int/float/bool/None
    positions: Positions
    ok: bool = True  # False when conversion found a problem: later stages skip the document


class _TooLarge(LlmgwError):
    pass


class _Converter:
    def __init__(self, file: str, positions: Positions, errors: list[ConfigError]) -> None:
        self.file = file
        self.positions = positions
        self.errors = errors
        self.ok = True
        self.nodes = 0
        self.active: set[int] = set()

    def problem(self, path: Path, message: str, hint: str | None = None, *, at_key: bool = False) -> None:
        self.ok = False
        pos = self.positions.key(path) if at_key else self.positions.value(path)
        self.errors.append(ConfigError(self.file, pos.line, pos.col, format_path(path), message, hint))

    def convert(self, obj: Any, path: Path) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _TooLarge
        if isinstance(obj, dict):
            return self._container(obj, path, self._mapping)
        if isinstance(obj, list):
            return self._container(obj, path, self._sequence)
        return self._scalar(obj, path)

    def _container(self, obj: Any, path: Path, fn: Any) -> Any:
        if id(obj) in self.active:
            self.problem(path, "this alias refers to a node that contains it (a cycle)", "remove the alias")
            return None
        self.active.add(id(obj))
        try:
            return fn(obj, path)
        finally:
            self.active.discard(id(obj))

    def _mapping(self, obj: dict[Any, Any], path: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        lc = getattr(obj, "lc", None)
        for raw_key, raw_value in obj.items():
            key = raw_key if isinstance(raw_key, str) else _abbreviated_repr(raw_key)
            sub = (*path, str(key))
            if lc is not None:
                _record(self.positions.keys, sub, lc.key, raw_key)
                _record(self.positions.values, sub, lc.value, raw_key)
            if not isinstance(raw_key, str):
                self.problem(
                    sub,
                    f"keys must be strings, got {_type_name(raw_key)} {key}",
                    "quote the key",
                    at_key=True,
                )
                continue
            out[str(raw_key)] = self.convert(raw_value, sub)
        return out

    def _sequence(self, obj: list[Any], path: Path) -> list[Any]:
        lc = getattr(obj, "lc", None)
        out = []
        for index, item in enumerate(obj):
            sub = (*path, index)
            if lc is not None:
                _record(self.positions.values, sub, lc.item, index)
            out.append(self.convert(item, sub))
        return out

    def _scalar(self, obj: Any, path: Path) -> Any:
        if obj is None or isinstance(obj, bool):
            return obj
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, int):  # also ruamel's ScalarBoolean, which is an int subclass
            if type(obj).__name__ == "ScalarBoolean":
                return bool(obj)
            if abs(obj) >= _MAX_INT:
                self.problem(path, "integer is out of range", "numbers must lie within ±2^63")
                return 0
            return int(obj)
        if isinstance(obj, float):
            if not math.isfinite(obj):
                self.problem(path, "number is not finite", "write a finite number")
                return 0.0
            return float(obj)
        if isinstance(obj, datetime.date):  # also datetime; unquoted dates are still meant as text
            return obj.isoformat()
        if isinstance(obj, TaggedScalar):
            self.problem(path, f"YAML tag `{obj.tag.value}` is not supported", "remove the tag")
            return None
        self.problem(
            path,
            f"unsupported YAML value ({_type_name(obj)})",
            "use strings, numbers, booleans, lists and mappings",
        )
        return None


def _record(table: dict[Path, Position], path: Path, getter: Any, key: Any) -> None:
    try:
        line, col = getter(key)
    except Exception:  # merged (`<<`) keys carry no position of their own
        return
    table[path] = Position(int(line) + 1, int(col) + 1)


def _type_name(obj: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", type(None): "null", bytes: "binary"}
    for kind, name in names.items():
        if isinstance(obj, kind):
            return name
    if isinstance(obj, tuple | list):
        return "list"
    if isinstance(obj, Mapping):
        return "mapping"
    if isinstance(obj, set | frozenset) or type(obj).__name__ == "CommentedSet":
        return "set"
    return type(obj).__name__


def _abbreviated_repr(obj: Any, limit: int = 40) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = f"<{_type_name(obj)}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _decode(file: str, data: bytes, errors: list[ConfigError]) -> str | None:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        errors.append(
            ConfigError(
                file,
                line,
                col,
                "",
                f"file is not valid UTF-8 (byte 0x{data[exc.start]:02x})",
                "save it as UTF-8",
            )
        )
        return None


_DUPLICATE = re.compile(r'found duplicate key "(.*)" with value')


def _yaml_error(file: str, exc: Exception) -> ConfigError:
    hint: str | None
    if isinstance(exc, DuplicateKeyError):
        mark = exc.problem_mark
        match = _DUPLICATE.search(str(exc.problem or ""))
        key = match.group(1) if match else "?"
        first = exc.context_mark
        where = f"it is already set at line {first.line + 1}; keep one" if first is not None else "keep one"
        # The ruamel message quotes both values; ours does not, since a value might be a secret.
        return ConfigError(file, mark.line + 1, mark.column + 1, "", f"duplicate key `{key}`", where)
    if isinstance(exc, MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or "invalid YAML"
        hint = None
        started = exc.context_mark
        if exc.context and started is not None and started.line != mark.line:
            what = (
                str(exc.context)
                .removeprefix("while parsing ")
                .removeprefix("while scanning ")
                .removeprefix("a ")
            )
            hint = f"check the {what} that starts at line {started.line + 1}"
        return ConfigError(file, mark.line + 1, mark.column + 1, "", f"YAML syntax error: {problem}", hint)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return ConfigError(file, line, col, "", f"cannot parse YAML: {detail}", None)


def parse_yaml(file: str, data: bytes) -> tuple[list[ParsedDocument], list[ConfigError]]:
    """Every document of a YAML file, with positions, and the problems found. Never raises.

    A file with a syntax error yields the problem and no documents: a half-read file would only add confusing
    errors about whatever the unread half defined.
    """
    errors: list[ConfigError] = []
    text = _decode(file, data, errors)
    if text is None:
        return [], errors
    yaml = YAML(typ="rt", pure=True)
    yaml.allow_duplicate_keys = False
    raw_docs: list[Any] = []
    try:
        for raw in yaml.load_all(text):
            raw_docs.append(raw)
    except (YAMLError, ValueError, TypeError, RecursionError, AttributeError, KeyError, IndexError) as exc:
        return [], [_yaml_error(file, exc)]
    except Exception as exc:  # ruamel is large; no input may turn into a traceback
        return [], [_yaml_error(file, exc)]
    docs: list[ParsedDocument] = []
    for index, raw in enumerate(raw_docs):
        if raw is None:  # an empty document (comments only, or a trailing `---`)
            continue
        lc = getattr(raw, "lc", None)
        start = (
            Position(int(lc.line) + 1, int(lc.col) + 1)
            if lc is not None and lc.line is not None
            else Position(1, 1)
        )
        positions = Positions(start=start, values={(): start})
        converter = _Converter(file, positions, errors)
        try:
            data_out = converter.convert(raw, ())
        except (_TooLarge, RecursionError):
            errors.append(
                ConfigError(
                    file,
                    start.line,
                    start.col,
                    "",
                    "document is too large or too deeply nested",
                    "expand fewer aliases",
                )
            )
            continue
        docs.append(ParsedDocument(file, index, data_out, positions, ok=converter.ok))
    return docs, errors
