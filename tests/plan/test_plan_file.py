"""core.plan.file: a saved plan's body, its digest, and the rule that refuses a stale one (pure: no disk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.adapters.repo_files import load_repo
from llmgw.core.desired.catalog import Catalog
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.views import LiveState
from llmgw.core.plan import (
    PLAN_FORMAT,
    StalePlan,
    check_plan_current,
    parse_saved_plan,
    plan_digest,
    plan_for_catalog,
    saved_plan,
    to_dict,
)

EXAMPLE = Path(__file__).parents[2] / "examples" / "cluster-repo"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    loaded = load_repo(EXAMPLE, revision="abc123")
    assert loaded.catalog is not None, loaded.errors
    return loaded.catalog


def _saved(catalog: Catalog, live: LiveState) -> dict[str, object]:
    return saved_plan(
        plan_for_catalog(catalog, live),
        repo_path="/repo",
        repo_revision="abc123",
        repo_content_hash="sha256:aaaa",
        live_source="saved state",
        created_at=1.0,
    )


def test_the_digest_names_the_actions_not_the_inputs(catalog: Catalog) -> None:
    body = to_dict(plan_for_catalog(catalog, LiveState(revision=None, models={})))
    assert plan_digest(body) == plan_digest({**body, "live_state_hash": "something else"})
    assert plan_digest(body) != plan_digest({**body, "summary": "another plan"})


def test_a_saved_plan_round_trips_through_its_text(catalog: Catalog) -> None:
    saved = _saved(catalog, LiveState(revision=None, models={}))
    assert saved["format"] == PLAN_FORMAT and saved["digest"] == plan_digest(saved["plan"])
    assert parse_saved_plan(json.dumps(saved)) == saved
    assert parse_saved_plan("not json") is None
    assert parse_saved_plan(json.dumps({"format": "something/v9"})) is None
    assert parse_saved_plan("[1, 2]") is None


def test_current_when_nothing_moved(catalog: Catalog) -> None:
    live = LiveState(revision=None, models={})
    check_plan_current(_saved(catalog, live), repo_content_hash="sha256:aaaa", catalog=catalog, live=live)


def test_stale_when_the_repo_changed(catalog: Catalog) -> None:
    live = LiveState(revision=None, models={})
    with pytest.raises(StalePlan, match="changed after the plan was made"):
        check_plan_current(_saved(catalog, live), repo_content_hash="sha256:bbbb", catalog=catalog, live=live)


def test_stale_when_another_revision_was_applied(catalog: Catalog) -> None:
    saved = _saved(catalog, LiveState(revision=None, models={}))
    moved = LiveState(revision="f00d" * 10, models={})
    with pytest.raises(StalePlan, match="applied f00df00df00d since") as caught:
        check_plan_current(saved, repo_content_hash="sha256:aaaa", catalog=catalog, live=moved)
    assert isinstance(caught.value, LlmgwError)


def test_a_moved_state_is_stale_only_when_the_plan_would_differ(catalog: Catalog) -> None:
    live = LiveState(revision=None, models={})
    saved = _saved(catalog, live)
    # The state hash differs from the one saved, yet planning again gives the same actions: still current.
    elsewhere = {**saved, "live": {**saved["live"], "state_hash": "not this state"}}
    check_plan_current(elsewhere, repo_content_hash="sha256:aaaa", catalog=catalog, live=live)
    # Forge a different plan under the same inputs: the digest no longer matches what planning now gives.
    forged = {**saved, "digest": "0" * 64, "live": {**saved["live"], "state_hash": "not this state"}}
    with pytest.raises(StalePlan, match="the live state changed after it was made"):
        check_plan_current(forged, repo_content_hash="sha256:aaaa", catalog=catalog, live=live)
