"""One duration grammar (llmgw.core.words): every form each old parser accepted still reads the same."""

from __future__ import annotations

import re

import pytest

from llmgw.core.config.models import Cluster
from llmgw.core.words import DURATION_PATTERN, DURATION_UNITS, parse_duration, short


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        # the cluster repo's form (was config.models.duration_seconds): whole number and ms s m h d
        ("500ms", 0.5),
        ("30s", 30.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("30d", 30 * 86400.0),
        ("0s", 0.0),
        # the controller's settings (was controller.settings.parse_duration): decimals, spaces, bare seconds
        ("1.5s", 1.5),
        (" 2 m ", 120.0),
        ("30", 30.0),
        ("0.25", 0.25),
        # key lifetimes (was adapters.keys.parse_duration): weeks
        ("2w", 14 * 86400.0),
    ],
)
def test_every_old_form_reads_the_same(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_numbers_are_seconds_where_bare_seconds_are_allowed() -> None:
    assert parse_duration(5) == 5.0 and parse_duration(0.5) == 0.5
    with pytest.raises(ValueError, match="write a unit"):
        parse_duration(5, bare_seconds=False)
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(True)


@pytest.mark.parametrize("bad", ["", "soon", "1y", "-1s", "1.s", ".5s", "5 mss", "s", "1e3s"])
def test_refusals_name_every_unit(bad: str) -> None:
    with pytest.raises(ValueError, match=r"ms, s, m, h, d or w") as caught:
        parse_duration(bad)
    assert repr(bad) in str(caught.value)


def test_bare_number_refused_when_the_caller_wants_a_unit() -> None:
    with pytest.raises(ValueError, match="not a duration: '30'"):
        parse_duration("30", bare_seconds=False)
    assert parse_duration("30s", bare_seconds=False) == 30.0


def test_positive_refuses_zero() -> None:
    with pytest.raises(ValueError, match="positive"):
        parse_duration("0d", positive=True)
    assert parse_duration("0d") == 0.0


def test_the_repo_pattern_is_the_whole_number_subset_of_the_grammar() -> None:
    for unit, factor in DURATION_UNITS.items():
        text = f"3{unit}"
        assert re.fullmatch(DURATION_PATTERN, text)
        assert parse_duration(text) == pytest.approx(3 * factor)
    for text in ("1.5m", "30", " 30s"):
        assert not re.fullmatch(DURATION_PATTERN, text)


def test_the_repo_accepts_weeks_like_the_commands() -> None:
    cluster = Cluster.model_validate(
        {
            "apiVersion": "llmgw/v1",
            "kind": "Cluster",
            "metadata": {"name": "c"},
            "spec": {"controller": {"lost_after": "1w"}},
        }
    )
    assert parse_duration(cluster.spec.controller.lost_after) == 7 * 86400.0


def test_short_revision() -> None:
    assert short("sha256:" + "ab" * 32) == "ab" * 6
    assert short("0123456789abcdef0123") == "0123456789ab"
    assert short(None) == "none" and short("") == "none"
    assert short(None, missing="-") == "-"
