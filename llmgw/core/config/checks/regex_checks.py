"""Whether a repo regex backtracks catastrophically: a repetition that holds another variable-length
repetition (`(a+)+`, `(\\w+\\s?)*`, `(a?){20}`) or an alternation whose branches may begin alike (`(a|ab)+`,
`(\\w|\\d)*`). On text that almost matches, such a pattern tries exponentially many ways to split it, and
Python's `re` holds the GIL all along (security review H7). `validate` refuses them where they are written;
a possessive quantifier (`\\w++`) or an atomic group (`(?>...)`) does not backtrack and is accepted.

Read from the parse tree of Python's own `re` parser (`re._parser`, the one `re.compile` uses). The check is
deliberately conservative: it refuses some patterns that would be fine (`(\\d{3}-?)+`), each with the way
to write it that is accepted.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

# Python's own regex parser (what re.compile runs); private modules, untyped in typeshed.
sre: Any = importlib.import_module("re._constants")
sre_parse: Any = importlib.import_module("re._parser")

__all__ = ["backtracking_reason"]

_REPEATS = {sre.MAX_REPEAT, sre.MIN_REPEAT}  # POSSESSIVE_REPEAT never gives back what it took


def backtracking_reason(pattern: str) -> str | None:
    """Why `pattern` backtracks catastrophically, or None. A pattern that does not compile is None here
    (its compile error is reported on its own)."""
    try:
        tree = sre_parse.parse(pattern)
    except (re.error, RecursionError):
        return None
    return _walk(list(tree), inside=None)


def _walk(items: list[tuple[Any, Any]], inside: str | None) -> str | None:
    """The first problem among `items`; `inside` names the repetition they are repeated by (None: none)."""
    for op, av in items:
        found = _one(op, av, inside)
        if found is not None:
            return found
    return None


def _one(op: Any, av: Any, inside: str | None) -> str | None:
    if op in _REPEATS:
        low, high, body = av
        variable = low != high
        if inside is not None and variable:
            return f"a variable repetition ({_count(low, high)}) inside a repetition ({inside})"
        repeats = high > 1
        return _walk(list(body), _count(low, high) if repeats else inside)
    if op == sre.BRANCH:
        branches = [list(b) for b in av[1]]
        if inside is not None and not _distinct_starts(branches):
            return f"an alternation whose branches may begin alike, inside a repetition ({inside})"
        for branch in branches:
            found = _walk(branch, inside)
            if found is not None:
                return found
        return None
    if op == sre.SUBPATTERN:
        return _walk(list(av[3]), inside)
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return _walk(list(av[1]), inside)
    if op == sre.GROUPREF_EXISTS:
        return _walk(list(av[1]), inside) or (_walk(list(av[2]), inside) if av[2] is not None else None)
    return None  # literals, classes, anchors; an atomic group or a possessive repeat keeps what it took


def _distinct_starts(branches: list[list[tuple[Any, Any]]]) -> bool:
    """Whether each branch begins with a literal character no other branch begins with."""
    firsts = []
    for branch in branches:
        if not branch or branch[0][0] != sre.LITERAL:
            return False
        firsts.append(branch[0][1])
    return len(set(firsts)) == len(firsts)


def _count(low: int, high: Any) -> str:
    if high == sre.MAXREPEAT:
        return {0: "`*`", 1: "`+`"}.get(low, f"`{{{low},}}`")
    if (low, high) == (0, 1):
        return "`?`"
    return f"`{{{low}}}`" if low == high else f"`{{{low},{high}}}`"
