"""JSON from peers, parsed without letting its shape crash the reader.

`json.loads` recurses once per nesting level, so `'[' * 200000` raises RecursionError, which is not a
ValueError: a reader that catches only ValueError turns a 400 KB body into a 500 and a traceback in the log,
before anyone is authenticated. A document that parses just under Python's limit is no better: the next
`json.dumps` of it, a few frames deeper, raises the same error. `loads` therefore refuses anything nested deeper
than `MAX_DEPTH` (far more than any API request needs: a tool's JSON schema nests a few dozen levels at most)
with an ordinary ValueError that says so.

Bytes are parsed by orjson first (a request body on the router's path: about a fifth of json's instructions)
whenever orjson is sure to read what json reads. Where it may not, json parses: a document with 20 digits in a
row (orjson reads an integer beyond 64 bits as a float, and an integer that long has 20 digits or more), and
anything orjson refuses (NaN, an infinity, a lone surrogate, a byte-order mark, UTF-16, and every document
that is not JSON, so that the error is json's, as it always was).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from llmgw.core.errors import LlmgwError

__all__ = ["MAX_DEPTH", "JsonTooDeep", "loads"]

MAX_DEPTH = 128
# Each digit as 0, anything else as a space: a run of 20 zeros marks a number orjson may not keep whole (the
# largest it does, 2**64 - 1, has 20 digits; 2**64 has 20 too). Digits in a string count as well: json parses.
_DIGIT_RUNS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_NUMBER = b"0" * 20


class JsonTooDeep(LlmgwError, ValueError):
    """The document nests arrays or objects deeper than MAX_DEPTH."""

    def __init__(self) -> None:
        super().__init__(f"arrays and objects nest deeper than {MAX_DEPTH} levels (the most accepted)")


def loads(data: str | bytes | bytearray) -> Any:
    """`json.loads`, refusing nesting deeper than MAX_DEPTH with `JsonTooDeep` (a ValueError)."""
    value = _orjson_exact(data) if isinstance(data, bytes) else _MISSING
    if value is _MISSING:
        try:
            value = json.loads(data)
        except RecursionError:
            raise JsonTooDeep() from None
    # Depth is at most the number of brackets: counting them is C speed, and settles almost every document
    # without walking it.
    brackets = (
        data.count("[") + data.count("{") if isinstance(data, str) else data.count(b"[") + data.count(b"{")
    )
    if brackets > MAX_DEPTH and _depth_over(value, MAX_DEPTH):
        raise JsonTooDeep()
    return value


_MISSING: Any = object()


def _orjson_exact(data: bytes) -> Any:
    """orjson's reading of `data` where it is json's, else _MISSING (json then parses)."""
    if _LONG_NUMBER in data.translate(_DIGIT_RUNS):
        return _MISSING
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # orjson nests at most 1024 deep: json's RecursionError then decides
        return _MISSING


def _depth_over(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` deep; iterative, so it cannot itself recurse too far."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        children = current.values() if isinstance(current, dict) else current
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False
