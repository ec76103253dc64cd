"""Numbers as people read them in the CLI's tables (llmgw.core.words): never `1e-06`, never 17 digits."""

from __future__ import annotations

import pytest

from llmgw.core.words import count, duration_words, money


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        (0.000001, "$0.000001"),
        (0.0000015, "$0.0000015"),
        (0.0042, "$0.0042"),
        (0.25, "$0.25"),
        (0.1, "$0.1"),
        (12.345, "$12.35"),
        (1234567.0, "$1,234,567.00"),
        (0.0, "$0"),
        (-0.5, "-$0.5"),
        (None, "-"),
    ],
)
def test_money_keeps_the_digits_that_matter(usd: float | None, text: str) -> None:
    assert money(usd) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (950, "950"),
        (1234, "1.2k"),
        (1000, "1k"),
        (34_567, "35k"),
        (1_500_000, "1.5M"),
        (2.5, "2.5"),
        (None, "-"),
    ],
)
def test_count_is_short(n: float | None, text: str) -> None:
    assert count(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.34, "340ms"),
        (4.2, "4.2s"),
        (45, "45s"),
        (125, "2m 5s"),
        (120, "2m"),
        (3 * 3600 + 600, "3h 10m"),
        (2 * 86400 + 4 * 3600 + 59, "2d 4h"),
        (None, "-"),
    ],
)
def test_duration_words_uses_the_two_largest_units(seconds: float | None, text: str) -> None:
    assert duration_words(seconds) == text
