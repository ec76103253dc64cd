"""`llmgw guard test`: the repo's guardrail judging a text offline, and through a judge when one is named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from router.helpers import SimProcess, start_sim, wait_healthy_sync
from typer.testing import CliRunner

from llmgw.cli.main import app

from .repo import files


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name, body in files().items():
        (tmp_path / name).write_bytes(body)
    return tmp_path


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["guard", "test", *args], env=env)
    return result.exit_code, result.output


def test_offline_it_shows_the_rules_the_verdict_and_the_redacted_text(repo: Path) -> None:
    code, out = run("org-pii", "mail jane@example.com", "--repo", str(repo))
    assert code == 0
    assert out.splitlines() == [
        "guardrail org-pii: mode redact, stages input",
        "  tripped: org-pii/pii.email",
        "verdict: redact",
        "redacted: mail [EMAIL]",
    ]
    code, out = run("team-words", "the forbidden x", "--repo", str(repo), "-f", "json")
    assert code == 1  # refused
    report = json.loads(out)
    assert report["action"] == "block" and report["rules"] == ["team-words/keyword"]
    assert report["refusal"] == "The request was blocked by guardrail `team-words` (rule keyword)."


def test_a_judge_not_asked_is_not_judged_never_safe(repo: Path) -> None:
    code, out = run("p1-judge", "build a bomb", "--repo", str(repo))
    assert code == 0
    assert "judge guard: offline: pass --judge-url to ask it (fails closed)" in out
    assert "verdict: unjudged" in out


def test_an_unknown_guardrail_names_the_ones_there_are(repo: Path) -> None:
    code, out = run("nope", "x", "--repo", str(repo))
    assert code == 2
    assert "no Guardrail `nope`" in out and "org-pii" in out


@pytest.fixture(scope="module")
def judge() -> Iterator[SimProcess]:
    sim = start_sim("guard", "k-judge", extra=["--judge-unsafe", "bomb=S9"])
    try:
        wait_healthy_sync([sim])
        yield sim
    finally:
        sim.kill()


@pytest.mark.integration
def test_with_a_judge_url_the_judge_is_asked(repo: Path, judge: SimProcess) -> None:
    env = {"LLMGW_API_KEY": judge.key}
    url = judge.base_url + "/v1"
    code, out = run("p1-judge", "how to build a bomb", "--repo", str(repo), "--judge-url", url, env=env)
    assert code == 1
    assert "judge guard: 'unsafe\\nS9' (fails closed)" in out
    assert (
        "refusal: The request was blocked by guardrail `p1-judge` (rule judge): S9 Indiscriminate Weapons."
        in out
    )
    code, out = run("p1-judge", "a picnic", "--repo", str(repo), "--judge-url", url, env=env)
    assert code == 0 and "verdict: pass" in out
