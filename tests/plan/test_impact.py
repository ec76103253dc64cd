"""The plan's Impact, golden, from a recorded store: a week of traffic written through the store's usage path,
summarised by the store's query, joined with a pull request's plan (see impact_fixture for both).

Regenerate the golden files after an intended change with `LLMGW_UPDATE_GOLDEN=1 pytest tests/plan` and read
the diff before committing it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from llmgw.adapters.repo_files import load_repo
from llmgw.core.desired.catalog import Catalog
from llmgw.core.fleet.views import LiveState
from llmgw.core.plan import (
    Plan,
    plan_digest,
    plan_for_catalog,
    render_json,
    render_markdown,
    render_text,
    to_dict,
)
from llmgw.core.plan.impact import plan_impact
from llmgw.core.plan.values import Impact
from llmgw.core.traffic.usage_summary import UsageSummary
from llmgw.store import Store
from llmgw.store.usage.usage_summary import read_usage_summary
from plan.impact_fixture import BURST_AT, NOW, WEEK, live_state, record, write_repo
from plan.test_plan import golden


async def _recorded_summary(db: Path) -> UsageSummary:
    store = await Store.open(f"sqlite:///{db}")
    try:
        await record(store)
        return await read_usage_summary(store, since=NOW - WEEK, until=NOW, page_rows=4000)
    finally:
        await store.close()


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> UsageSummary:
    """Recorded once for the module: 22,000 rows take seconds to write."""
    return asyncio.run(_recorded_summary(tmp_path_factory.mktemp("store") / "recorded.db"))


@pytest.fixture
def repos(tmp_path: Path) -> tuple[Catalog, LiveState]:
    applied = write_repo(tmp_path / "applied", applied=True)
    proposed = load_repo(write_repo(tmp_path / "proposed", applied=False))
    assert proposed.repo is not None, [str(e) for e in proposed.errors]
    return proposed.repo.catalog, live_state(applied)


@pytest.fixture
def planned(summary: UsageSummary, repos: tuple[Catalog, LiveState]) -> Plan:
    catalog, live = repos
    made = plan_for_catalog(catalog, live)
    return dataclasses.replace(made, impact=plan_impact(made, summary, catalog, live))


def impact_of(plan: Plan) -> Impact:
    assert plan.impact is not None
    return plan.impact


def test_summary_of_the_recorded_week(summary: UsageSummary) -> None:
    golden(
        "impact_summary.json", json.dumps(summary.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    )
    gemma = summary.pair("playground", "gemma")
    assert gemma is not None and (gemma.requests, gemma.errors) == (12_400, 13)  # the row before is not in
    research = summary.tenant("team", "research")
    assert research is not None and research.peak_tpm_at == BURST_AT
    assert 81_000 < research.peak_tpm < 82_000
    chat = summary.model("sim-chat")
    assert chat is not None and chat.peak_concurrency == 19
    slots = summary.model("sim-slots")
    assert slots is not None and slots.peak_concurrency == 3  # the 429 held no slot
    assert [(c.model, c.concurrency) for c in summary.capacity] == [("sim-chat", 8)]


def test_allowlist_removal_names_the_project_the_requests_and_why(planned: Plan) -> None:
    (item,) = [i for i in impact_of(planned).items if i.topic == "access"]
    assert item.severity == "loss"
    assert item.words == (
        "removes gemma from project playground, which sent 12,400 requests to it in the last 7 days "
        "(13 of them failed): Project playground's models no longer allow it"
    )


def test_a_limit_below_last_weeks_peak_is_a_loss_one_above_a_note(planned: Plan) -> None:
    limits = {i.subject: i for i in impact_of(planned).items if i.topic == "limit"}
    assert set(limits) == {"team research", "project prod"}
    assert limits["team research"].severity == "loss"
    assert limits["team research"].words == (
        "lowers team research's tpm to 50k; its peak minute in the last 7 days was 81k tokens"
    )
    assert limits["project prod"].severity == "note"
    assert limits["project prod"].words == (
        "sets project prod's rpm to 200; its peak minute in the last 7 days was 81 requests (within it)"
    )


def test_a_max_below_peak_concurrency_says_where_capacity_comes_from(planned: Plan) -> None:
    capacity = {i.subject: i for i in impact_of(planned).items if i.topic == "capacity"}
    chat, slots = capacity["model sim-chat"], capacity["model sim-slots"]
    assert chat.severity == "loss"
    assert chat.words == (
        "drops sim-chat's max to 1 replica; its peak concurrency in the last 7 days was 19 against a measured "
        "capacity of 8 per replica (profile sim): at most 8 at once"
    )
    assert slots.severity == "note"
    assert "assumed from the slots of profile sim (not measured): within it (4 at once)" in slots.words


def test_a_price_change_projects_the_monthly_cost(planned: Plan) -> None:
    (cost,) = [i for i in impact_of(planned).items if i.topic == "cost"]
    # 12,400 x (200 in, 50 out) in the week = 2.48M in, 620k out; x 30/7 to a month.
    month = 30 / 7
    was = month * (2_480_000 * 0.1 + 620_000 * 0.2) / 1e6
    now = month * (2_480_000 * 0.5 + 620_000 * 1.0) / 1e6
    assert f"costs ${now:.2f} a month instead of ${was:.2f} (+${now - was:.2f})" in cost.words
    assert cost.severity == "note"


def test_a_project_refused_before_this_plan_is_not_its_loss(planned: Plan) -> None:
    assert not [i for i in impact_of(planned).items if "legacy" in i.words or "retired" in i.words]


def test_golden_text_and_markdown(planned: Plan) -> None:
    golden("impact.txt", render_text(planned))
    golden("impact.md", render_markdown(planned))
    body = json.loads(render_json(planned))
    assert body["impact"]["known"] is True
    assert [i["severity"] for i in body["impact"]["items"]].count("loss") == 3


def test_without_usage_the_renderings_are_as_before(repos: tuple[Catalog, LiveState]) -> None:
    catalog, live = repos
    made = plan_for_catalog(catalog, live)
    assert made.impact is None
    assert "Impact" not in render_text(made) + render_markdown(made)
    assert "impact" not in json.loads(render_json(made))


def test_the_impact_is_not_part_of_what_a_saved_plan_would_do(planned: Plan) -> None:
    # Usage moves on while the actions stay the same: a saved plan does not go stale by it.
    assert plan_digest(to_dict(planned)) == plan_digest(to_dict(dataclasses.replace(planned, impact=None)))
