"""The small words every command and document shares: durations, short revisions, and numbers as people read
them (`$0.000001`, `1.2k`, `2m 5s`).

One duration grammar for the cluster repo, the controller's settings and every CLI flag, so the same text
means the same time everywhere:

    duration := number [unit]        number := digits [ "." digits ]
    unit     := ms | s | m | h | d | w   (milliseconds, seconds, minutes, hours, days, weeks of 7 days)

Spaces around the number and the unit are allowed. A bare number (no unit) is seconds, but only where the
caller allows it (`bare_seconds=True`: the controller's settings and flags); the cluster repo's schema and
`llmgw keys create --expires-in` want the unit written. The repo's schema admits the whole-number subset
(`DURATION_PATTERN`: `30s`, not `1.5m`), so a document stays easy to diff.
"""

from __future__ import annotations

import re

__all__ = [
    "DURATION_HELP",
    "DURATION_OR_SECONDS_PATTERN",
    "DURATION_PATTERN",
    "DURATION_UNITS",
    "count",
    "duration_words",
    "money",
    "parse_duration",
    "short",
]

DURATION_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
}
_UNIT_CHOICE = "|".join(sorted(DURATION_UNITS, key=len, reverse=True))  # `ms` before `m`
_DURATION = re.compile(rf"\s*([0-9]+(?:\.[0-9]+)?)\s*({_UNIT_CHOICE})?\s*")

# The cluster repo's form: a whole number and a unit, nothing else (JSON Schema `pattern`).
DURATION_PATTERN = rf"^[0-9]+({_UNIT_CHOICE})$"
# What parse_duration takes (less the spaces it forgives): a bare number is seconds, a fraction is allowed.
DURATION_OR_SECONDS_PATTERN = rf"^[0-9]+(\.[0-9]+)?({_UNIT_CHOICE})?$"
DURATION_HELP = "a number and a unit: ms, s, m, h, d or w (e.g. 500ms, 30s, 10m, 1h, 30d, 2w)"


def parse_duration(text: str | float | int, *, bare_seconds: bool = True, positive: bool = False) -> float:
    """Seconds in a duration such as `500ms`, `30s`, `1.5m`, `12h`, `30d`, `2w` (see the module's grammar).

    `bare_seconds`: a number without a unit (`"30"`, or an int or float) is seconds; when False it is refused.
    `positive`: zero is refused too. Raises ValueError naming what is accepted.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r} (expected {DURATION_HELP})")
    if isinstance(text, int | float):
        if not bare_seconds:
            raise ValueError(f"not a duration: {text!r} (write a unit: {DURATION_HELP})")
        seconds = float(text)
    else:
        match = _DURATION.fullmatch(text)
        if match is None or (match.group(2) is None and not bare_seconds):
            bare = ", or a bare number of seconds" if bare_seconds else ""
            raise ValueError(f"not a duration: {text!r} (expected {DURATION_HELP}{bare})")
        seconds = float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]
    if seconds < 0 or (positive and seconds == 0):
        raise ValueError(
            f"not a duration: {text!r} (expected a {'positive' if positive else 'non-negative'} time)"
        )
    return seconds


def short(revision: str | None, *, missing: str = "none") -> str:
    """A revision as people read it: 12 hex digits of a git SHA or of a content hash (without `sha256:`).

    `missing` is what stands for no revision (None or empty): "none" in sentences, "-" in tables.
    """
    if not revision:
        return missing
    return revision.split(":", 1)[-1][:12]


def money(usd: float | None, *, missing: str = "-") -> str:
    """Dollars with the digits that matter: `$12.35`, `$0.0042`, `$0.000001`, `$0`; never `1e-06`.

    Cents for a dollar or more; below that, two significant digits (LLM prices are fractions of a cent)."""
    if usd is None:
        return missing
    sign, amount = ("-", -usd) if usd < 0 else ("", usd)
    if amount == 0:
        return "$0"
    if amount >= 1:
        return f"{sign}${amount:,.2f}"
    decimals = 2
    while decimals < 12 and amount < 10 ** (1 - decimals):
        decimals += 1
    text = f"{amount:.{decimals}f}".rstrip("0").rstrip(".")
    return f"{sign}${text}"


_COUNT_UNITS = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def count(n: float | None, *, missing: str = "-") -> str:
    """A count as people read it: `950`, `1.2k`, `34k`, `1.5M` (whole below a thousand)."""
    if n is None:
        return missing
    for size, unit in _COUNT_UNITS:
        if abs(n) >= size:
            value = n / size
            text = f"{value:.1f}".removesuffix(".0") if abs(value) < 10 else f"{value:.0f}"
            return text + unit
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def duration_words(seconds: float | None, *, missing: str = "-") -> str:
    """A span in the two largest units that matter: `340ms`, `4.2s`, `2m 5s`, `3h 10m`, `2d 4h`."""
    if seconds is None:
        return missing
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}".removesuffix(".0") + "s"
    whole = round(seconds)
    for big, big_unit, small, small_unit in (
        (86400, "d", 3600, "h"),
        (3600, "h", 60, "m"),
        (60, "m", 1, "s"),
    ):
        if whole >= big:
            rest = (whole % big) // small
            return f"{whole // big}{big_unit}" + (f" {rest}{small_unit}" if rest else "")
    return f"{whole}s"
