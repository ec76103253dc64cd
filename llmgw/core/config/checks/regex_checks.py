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

__all__ = ["backtracking_reason", "bounded_work"]

_REPEATS = {sre.MAX_REPEAT, sre.MIN_REPEAT}  # POSSESSIVE_REPEAT never gives back what it took
# The most ways a bounded pattern may try at one position of a text (bounded_work).
MAX_WAYS = 64
_ONE_WAY = {sre.NOT_LITERAL, sre.ANY, sre.IN, sre.AT}


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


def bounded_work(pattern: str) -> bool:
    """Whether matching `pattern` at one position of a text tries at most MAX_WAYS ways, however the text
    goes on: literals, classes and anchors, groups and lookarounds of them, alternations and repetitions of a
    fixed most (`{3}`, `{0,2}`, `?`), never an open one (`*`, `+`, `{2,}`) nor a backreference. Such a
    pattern searches a text in time linear in its length, with a small constant: a guardrail's scan of a
    short prompt can run on the event loop (llmgw_router.path.guard). Conservative: a `{` read as a literal
    is refused too (the `regex` module reads `{e<=1}` as fuzzy matching, which `re`'s parser does not know),
    and so is whatever `re`'s parser cannot read."""
    try:
        tree = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return _ways(list(tree)) is not None


def _ways(items: list[tuple[Any, Any]]) -> int | None:
    """How many ways `items` in sequence may be tried at one position; None past MAX_WAYS or unbounded."""
    total = 1
    for op, av in items:
        ways = _ways_one(op, av)
        if ways is None or total * ways > MAX_WAYS:
            return None
        total *= ways
    return total


def _ways_one(op: Any, av: Any) -> int | None:
    if op == sre.LITERAL:
        return None if av == ord("{") else 1
    if op in _ONE_WAY:
        return 1
    if op == sre.SUBPATTERN:
        return _ways(list(av[3]))
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return _ways(list(av[1]))
    if op == sre.BRANCH:
        counts = [_ways(list(b)) for b in av[1]]
        total = sum(c for c in counts if c is not None)
        return None if None in counts or total > MAX_WAYS else total
    if op in (*_REPEATS, sre.POSSESSIVE_REPEAT):
        low, high, body = av
        once = _ways(list(body))
        if high == sre.MAXREPEAT or once is None:
            return None
        total = 0
        for times in range(low, high + 1):  # each count of repetitions tried, each with its ways
            total += once**times
            if total > MAX_WAYS:
                return None
        return total
    return None  # a backreference, a conditional, an atomic group: not counted, so not bounded
