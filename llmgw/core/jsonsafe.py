"""JSON from peers, parsed without letting its shape crash the reader.

`json.loads` recurses once per nesting level, so `'[' * 200000` raises RecursionError, which is not a
ValueError: a reader that catches only ValueError turns a 400 KB body into a 500 and a traceback in the log,
before anyone is authenticated. A document that parses just under Python's limit is no better: the next
`json.dumps` of it, a few frames deeper, raises the same error. `loads` therefore refuses anything nested deeper
than `MAX_DEPTH` (far more than any API request needs: a tool's JSON schema nests a few dozen levels at most)
with an ordinary ValueError that says so.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.core.errors import LlmgwError

__all__ = ["MAX_DEPTH", "JsonTooDeep", "loads"]

MAX_DEPTH = 128


class JsonTooDeep(LlmgwError, ValueError):
    """The document nests arrays or objects deeper than MAX_DEPTH."""

    def __init__(self) -> None:
        super().__init__(f"arrays and objects nest deeper than {MAX_DEPTH} levels (the most accepted)")


def loads(data: str | bytes | bytearray) -> Any:
    """`json.loads`, refusing nesting deeper than MAX_DEPTH with `JsonTooDeep` (a ValueError)."""
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
