"""The Impact's rules one at a time, on small summaries: the folding (minutes, the concurrency sweep, what
holds a slot), a budget against the window's spend, a removed model, a plan without tenants, unknown usage."""

from __future__ import annotations

import dataclasses
from array import array
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from llmgw.adapters.repo_files import load_repo
from llmgw.core.plan import plan_for_catalog, render_markdown, render_text
from llmgw.core.plan.impact import NOT_IN_SAVED_STATE, plan_impact, unknown_impact
from llmgw.core.traffic.usage_summary import UsageFolder, UsageRow, UsageSummary, peak_overlap
from plan.impact_fixture import NOW, WEEK, live_state, write_repo


def row(
    at: float, latency_s: float = 1.0, status: int = 200, tokens: int = 10, project: str = "p"
) -> UsageRow:
    return UsageRow(at, "o", "t", project, "m", tokens, 0, 0.0, latency_s * 1000, status)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10)), max_size=40))
def test_the_sweep_finds_the_most_intervals_open_at_once(spans: list[tuple[int, int]]) -> None:
    starts = array("d", [float(s) for s, _ in spans])
    ends = array("d", [float(s + d) for s, d in spans])
    brute = max(
        (sum(1 for s, e in zip(starts, ends, strict=True) if s <= t < e) for t in starts),
        default=0,
    )
    assert peak_overlap(starts, ends)[0] == brute


def test_minutes_are_calendar_minutes_and_a_429_holds_no_slot() -> None:
    folder = UsageFolder(0.0, 600.0)
    for at in (59.0, 59.5, 60.0, 61.0, 62.0):
        folder.add(row(at, tokens=100))
    folder.add(row(62.5, latency_s=30, status=429))  # refused after waiting: demand, not a slot held
    got = folder.summary()
    project = got.tenant("project", "p")
    assert project is not None
    assert (project.peak_rpm, project.peak_rpm_at, project.peak_tpm) == (4, 60.0, 310)
    model = got.model("m")
    # [58,59] [58.5,59.5] [59,60] [60,61] [61,62]: two at once at most (one ending as another starts is not
    # open with it); the 429's thirty seconds would have made it three.
    assert model is not None and model.peak_concurrency == 2
    with pytest.raises(ValueError, match="oldest first"):
        folder.add(row(1.0))


def test_levels_without_a_name_are_not_tenants() -> None:
    folder = UsageFolder(0.0, 60.0)
    folder.add(UsageRow(1.0, "", "", "p", "m", 1, 1, 0.0, 10.0, 200))
    assert [(t.level, t.name) for t in folder.summary().tenants] == [("project", "p")]


def summary(**pairs: int) -> UsageSummary:
    """A week in which each project sent `n` requests to gemma, each 1,000 tokens in and $0.01."""
    return UsageSummary.model_validate(
        {
            "since": NOW - WEEK,
            "until": NOW,
            "rows": sum(pairs.values()),
            "earliest": NOW - WEEK,
            "pairs": [
                {"project": p, "model": "gemma", "requests": n, "tokens_in": 1000 * n, "cost": 0.01 * n}
                for p, n in pairs.items()
            ],
            "models": [
                {"model": "gemma", "requests": sum(pairs.values()), "tokens_in": 1000 * sum(pairs.values())}
            ],
            "tenants": [
                {"level": "project", "name": p, "peak_tpm": 1000, "peak_rpm": 1, "cost": 0.01 * n}
                for p, n in pairs.items()
            ],
        }
    )


def plan_between(tmp: Path, edit: dict[str, str | None], usage: UsageSummary) -> list[tuple[str, str]]:
    applied = write_repo(tmp / "applied", applied=True)
    proposed = write_repo(tmp / "proposed", applied=True)
    for rel, text in edit.items():
        if text is None:
            (proposed / rel).unlink()
        else:
            (proposed / rel).write_text(text)
    loaded = load_repo(proposed)
    assert loaded.repo is not None, [str(e) for e in loaded.errors]
    live = live_state(applied)
    made = plan_for_catalog(loaded.repo.catalog, live)
    impact = plan_impact(made, usage, loaded.repo.catalog, live)
    return [(i.severity, i.words) for i in impact.items]


BUDGET = """apiVersion: llmgw/v1
kind: Project
metadata: {name: extra}
spec:
  team: research
  limits: {budget: {amount: %s, period: 30d}}
"""


def test_a_budget_below_the_spend_at_the_windows_rate_is_a_loss(tmp_path: Path) -> None:
    # 700 requests at $0.01 in 7 days: $30 in 30 days.
    items = plan_between(tmp_path, {"extra.yaml": BUDGET % 20}, summary(extra=700))
    assert items == [
        (
            "loss",
            "sets project extra's budget to $20.00 per 30d; at the rate of the last 7 days it spends "
            "$30.00 per 30d",
        ),
    ]
    (tmp_path / "again").mkdir()
    items = plan_between(tmp_path / "again", {"extra.yaml": BUDGET % 40}, summary(extra=700))
    assert [s for s, _ in items] == ["note"] and items[0][1].endswith("(within it)")


def test_a_removed_model_is_lost_to_every_project_that_used_it_and_its_cost_goes(tmp_path: Path) -> None:
    items = plan_between(tmp_path, {"models/gemma.yaml": None}, summary(playground=5, prod=2))
    assert items[:2] == [
        (
            "loss",
            "removes gemma from project playground, which sent 5 requests to it in the last 7 days: "
            "model gemma is removed",
        ),
        (
            "loss",
            "removes gemma from project prod, which sent 2 requests to it in the last 7 days: "
            "model gemma is removed",
        ),
    ]
    assert items[2][0] == "note" and items[2][1].startswith(
        "removes model gemma: its traffic of the last 7 days"
    )


def test_a_removed_project_loses_what_it_used(tmp_path: Path) -> None:
    applied = write_repo(tmp_path / "x", applied=True)
    text = (applied / "tenants.yaml").read_text()
    without_prod = text[: text.index("---\napiVersion: llmgw/v1\nkind: Project\nmetadata: {name: prod}")]
    without_prod += text[text.index("---\napiVersion: llmgw/v1\nkind: Project\nmetadata: {name: legacy}") :]
    items = plan_between(tmp_path, {"tenants.yaml": without_prod}, summary(prod=3))
    assert items == [
        (
            "loss",
            "removes gemma from project prod, which sent 3 requests to it in the last 7 days: "
            "Project prod is removed",
        ),
    ]


def test_unknown_usage_is_said_once_and_gates_nothing(tmp_path: Path) -> None:
    applied = write_repo(tmp_path / "applied", applied=True)
    loaded = load_repo(write_repo(tmp_path / "proposed", applied=False))
    assert loaded.repo is not None
    made = plan_for_catalog(loaded.repo.catalog, live_state(applied))
    made = dataclasses.replace(made, impact=unknown_impact(NOT_IN_SAVED_STATE))
    text, markdown = render_text(made), render_markdown(made)
    assert text.count("usage: not in this saved state") == 1 and "Impact: usage: not in" in text
    assert markdown.count("usage: not in this saved state") == 1 and "#### Impact" in markdown
    assert made.impact is not None and made.impact.losses == ()


@given(st.lists(st.tuples(st.floats(0, 600), st.integers(0, 50)), min_size=1, max_size=40))
def test_the_busiest_minute_is_the_calendar_minute_with_the_most_tokens(
    rows: list[tuple[float, int]],
) -> None:
    rows.sort()
    folder = UsageFolder(0.0, 660.0)
    for at, tokens in rows:
        folder.add(row(at, tokens=tokens))
    by_minute: dict[int, int] = {}
    for at, tokens in rows:
        by_minute[int(at // 60)] = by_minute.get(int(at // 60), 0) + tokens
    project = folder.summary().tenant("project", "p")
    assert project is not None and project.peak_tpm == max(by_minute.values())


CONCURRENCY = """\
apiVersion: llmgw/v1
kind: Project
metadata: {name: extra}
spec:
  team: research
  limits: {concurrency: 5}
"""


def test_a_concurrency_limit_below_the_tenants_peak_is_a_loss(tmp_path: Path) -> None:
    usage = summary(extra=10)
    tenants = [t.model_copy(update={"peak_concurrency": 9}) for t in usage.tenants]
    items = plan_between(tmp_path, {"extra.yaml": CONCURRENCY}, usage.model_copy(update={"tenants": tenants}))
    assert items == [
        (
            "loss",
            "sets project extra's concurrency to 5; its peak concurrency in the last 7 days was 9 requests "
            "at once",
        ),
    ]
