"""`llmgw plan --suggest --post` (issue 50): the document the run sends is what the admin API's boundary model
accepts, one candidate per replayed configuration with the suggestion marked, and the console's chart places
each one by its cost and its p99 TTFT against the objective's line; `--post` with a saved state (no
controller to send to) is refused before any search. The browser test (tests/console/test_console.py) draws a
posted one."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest
from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for
from pydantic import ValidationError
from typer.testing import CliRunner

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.main import app
from llmgw.cli.repo import plan_simulate as sim
from llmgw.cli.repo.plan_suggest import suggest
from llmgw.controller.app import start_controller
from llmgw.controller.console.suggested import chart
from llmgw.core.api.suggestions import PostedSuggestion, SuggestionBody
from llmgw.core.fleet.views import LiveState

from . import test_suggest_plan as case

files = case.files  # the repo, its saved live state, the capacity file and the trace


def _posted(files: dict[str, Path]) -> PostedSuggestion:
    loaded = load_repo(files["root"])
    assert loaded.repo is not None
    live = LiveState.model_validate_json((files["tmp"] / "state-8.json").read_text())
    measured = sim.fetch_measurements(files["capacity"], None)
    found = suggest(
        loaded.repo.catalog, loaded.documents, live, files["trace"], measured, revision="0123abcd"
    )
    assert found.document is not None
    body = SuggestionBody.model_validate(found.document)
    return PostedSuggestion(suggestion=body, posted_at=1_780_000_000.0, posted_by="ci")


def test_the_posted_document_is_the_replay_with_the_suggestion_marked(files: dict[str, Path]) -> None:
    posted = _posted(files)
    s = posted.suggestion
    assert (s.revision, s.objective, s.currency, s.found) == ("0123abcd", "cost", "USD", True)
    assert [c.name for c in s.candidates][:2] == ["suggested", "runner-up 1"]
    assert [c.chosen for c in s.candidates] == [True] + [False] * (len(s.candidates) - 1)
    best, runner = s.candidates[0], s.candidates[1]
    assert best.configuration == "chat: l4 x 7" and round(best.cost_per_hour, 2) == 5.60 and best.met
    assert runner.configuration == "chat: h100 x 3" and round(runner.cost_per_hour, 2) == 9.00
    assert best.ttft_share is not None and 0 < best.ttft_share <= 1, "met: at or under its objective"
    assert "exhaustive: 72 configurations" in s.method
    assert "Suggested fleet (objective cost):" in s.text
    drawn = chart(posted)
    assert len(drawn.points) == len(s.candidates) and not drawn.undrawn
    mine = next(p for p in drawn.points if p.candidate.chosen)
    assert mine.y > drawn.slo_y, "under the objective's line (SVG y grows downward)"
    assert mine.x < next(p.x for p in drawn.points if p.candidate.name == "runner-up 1"), "the cheaper"


def test_a_body_out_of_shape_is_refused_saying_where(files: dict[str, Path]) -> None:
    body = _posted(files).suggestion.model_dump()
    body["candidates"][0]["availability"] = 1.5
    with pytest.raises(ValidationError, match=r"candidates\.0\.availability"):
        SuggestionBody.model_validate(body)
    body["candidates"][0]["availability"] = 1.0
    body["candidates"][0]["cost_per_hour"] = "5.60"  # a string is no cost, as the schema says
    with pytest.raises(ValidationError, match=r"candidates\.0\.cost_per_hour"):
        SuggestionBody.model_validate(body)
    body["candidates"][0]["cost_per_hour"] = 5.6
    assert SuggestionBody.model_validate({**body, "busiest_hour": 9.0}).busiest_hour == 9, "JSON's 9.0 is 9"


def test_post_without_a_controller_is_refused(files: dict[str, Path]) -> None:
    args = ["plan", str(files["root"]), "--state", str(files["tmp"] / "state-8.json"), "--suggest", "--post"]
    args += ["--capacity", str(files["capacity"]), "--trace", str(files["trace"])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "error: --post sends the suggestion to the controller: drop --state" in result.stderr


def _suggestions(url: str, token: str) -> list[dict[str, object]]:
    ask = urllib.request.Request(url + "/api/v1/suggestions", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(ask, timeout=10) as r:
        return list(json.loads(r.read())["suggestions"])


async def test_post_keeps_the_suggestion_on_the_controller(files: dict[str, Path], tmp_path: Path) -> None:
    repo = Repo(tmp_path / "applied", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    running = await start_controller(settings_for(tmp_path, repo.path))
    try:
        token = tmp_path / "admin-token"
        token.write_text(running.admin_token + "\n")
        args = ["plan", str(files["root"]), "--controller", running.url, "--token-file", str(token)]
        args += ["--suggest", "--post", "--capacity", str(files["capacity"]), "--trace", str(files["trace"])]
        result = await asyncio.to_thread(CliRunner().invoke, app, args)  # its client blocks: off the loop
        assert result.exit_code == 0, (result.stdout, result.stderr)
        loaded = load_repo(files["root"])
        assert loaded.repo is not None and loaded.repo.revision
        assert (
            f"--post: the console's plan page shows the suggestion for {loaded.repo.revision}"
            in result.stderr
        )
        kept = await asyncio.to_thread(_suggestions, running.url, running.admin_token)
        assert len(kept) == 1 and kept[0]["posted_by"] == "admin"
        body = SuggestionBody.model_validate(kept[0]["suggestion"])
        assert body.revision == loaded.repo.revision and body.found
        # The controller runs no node: it limits no GPU class, and the cheapest fleet is chosen.
        assert body.candidates[0].chosen and body.candidates[0].configuration == "chat: l4 x 7"
        assert "Suggested fleet (objective cost):" in body.text
    finally:
        await running.stop()
