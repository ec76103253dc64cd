"""Eval suites: each check one by one, a judge's verdict from a sim judge, the pass threshold, and what
`llmgw validate` says of a suite that could only fail at run time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from llmgw_agent.sim import Behaviour, SimEngine
from llmgw_agent.sim_model import LatencyConfig
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.controller.loops.evals import EngineTarget, run_suite
from llmgw.core.config.specs.eval_spec import EvalCheck, EvalSuiteSpec
from llmgw.core.evals.suites import check_answer, judge_verdict

FAST = LatencyConfig(prefill_ms_per_token=0.0, decode_ms_per_token=0.0, max_concurrency=4)


def _check(**kw: object) -> EvalCheck:
    return EvalCheck.model_validate(kw)


@pytest.mark.parametrize(
    ("check", "answer", "passed", "words"),
    [
        ({"contains": "Paris"}, "The capital is Paris.", True, "contains 'Paris'"),
        ({"contains": "Paris"}, "The capital is paris.", False, "does not contain 'Paris'"),
        ({"contains": "Paris", "ignore_case": True}, "it is PARIS", True, "contains"),
        ({"regex": r"^\d{4}-\d{2}-\d{2}$"}, "2026-12-01", True, "matches"),
        ({"regex": r"^\d{4}-\d{2}-\d{2}$"}, "1 Dec 2026", False, "does not match"),
        ({"number": {"value": 3.14, "tolerance": 0.01}}, "pi is about 3.141", True, "3.141 is within 0.01"),
        ({"number": {"value": 3.14, "tolerance": 0.01}}, "pi is about 3.2", False, "3.2 is not within"),
        ({"number": {"value": 1000}}, "one thousand", False, "no number in the answer"),
        ({"number": {"value": 1000}}, "1,000 exactly", True, "within"),
    ],
)
def test_each_text_check(check: dict[str, object], answer: str, passed: bool, words: str) -> None:
    ok, detail = check_answer(_check(**check), answer)
    assert ok is passed
    assert words in detail


def test_json_schema_check_says_where_the_document_is_wrong() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    check = _check(json_schema=schema)
    assert check_answer(check, '{"n": 3}') == (True, "JSON valid against the schema")
    ok, detail = check_answer(check, '{"n": "three"}')
    assert not ok and "at n" in detail and "'three' is not of type 'integer'" in detail
    ok, detail = check_answer(check, "n is 3")
    assert not ok and detail.startswith("not JSON")


def test_a_judge_answer_with_no_verdict_is_a_failed_case() -> None:
    assert judge_verdict("PASS: polite and right")[0] is True
    assert judge_verdict("fail, it is rude")[0] is False
    ok, detail = judge_verdict("I cannot say")
    assert not ok and "neither PASS nor FAIL" in detail
    assert judge_verdict(None) == (False, "the judge gave no answer")


async def _serve(engine: SimEngine) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(engine.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, EngineTarget]]:
    """A candidate sim that knows two answers, a judge that passes, a judge that fails."""
    made = {
        "cand": Behaviour(answers=(("France", "The capital of France is Paris."), ("sum", "The sum is 42"))),
        "kind-judge": Behaviour(answers=(("*", "PASS polite and correct"),)),
        "harsh-judge": Behaviour(answers=(("*", "FAIL not polite"),)),
    }
    runners, targets = [], {}
    for name, behaviour in made.items():
        runner, url = await _serve(SimEngine(name, FAST, "k-" + name, behaviour))
        runners.append(runner)
        targets[name] = EngineTarget(f"{name}-r1", name, url, "k-" + name, "sim")
    yield targets
    for runner in runners:
        await runner.cleanup()


def _suite(judge: str, threshold: float = 1.0) -> EvalSuiteSpec:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return EvalSuiteSpec.model_validate(
        {
            "judge": judge,
            "pass_threshold": threshold,
            "cases": [
                {"name": "capital", "prompt": "Capital of France?", "check": {"contains": "Paris"}},
                {"name": "shape", "prompt": "Capital of France?", "check": {"regex": r"capital of \w+ is"}},
                {"name": "sum", "prompt": "The sum of 40 and 2?", "check": {"number": {"value": 42}}},
                {
                    "name": "json",
                    "prompt": "A city as JSON",
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "c", "schema": schema},
                    },
                    "check": {"json_schema": schema},
                },
                {"name": "polite", "prompt": "Say hi to France", "check": {"judge": {"criteria": "polite"}}},
            ],
        }
    )


async def test_a_suite_against_a_sim_with_a_sim_judge(engines: dict[str, EngineTarget]) -> None:
    async with aiohttp.ClientSession() as session:
        kind = await run_suite(session, "basics", _suite("kind-judge"), engines["cand"], engines)
        harsh = await run_suite(session, "basics", _suite("harsh-judge"), engines["cand"], engines)
        lenient = await run_suite(session, "basics", _suite("harsh-judge", 0.8), engines["cand"], engines)
    assert [c.passed for c in kind.cases] == [True, True, True, True, True], [c.detail for c in kind.cases]
    assert kind.passed and kind.score == 1.0
    assert json.loads(kind.cases[3].answer or "") == {"city": "sim"}
    polite = harsh.cases[4]
    assert not polite.passed and polite.detail == "judge: FAIL not polite"
    assert not harsh.passed and harsh.score == 0.8
    assert harsh.words() == "suite basics failed: 4/5 cases (threshold 1)"
    assert lenient.passed  # 4 of 5 meet a threshold of 0.8


async def test_a_judge_with_no_replica_and_an_unreachable_engine_fail_their_cases(
    engines: dict[str, EngineTarget],
) -> None:
    gone = EngineTarget("gone-r1", "gone", "http://127.0.0.1:9", None, "sim")
    async with aiohttp.ClientSession() as session:
        nobody = await run_suite(session, "s", _suite("no-such-judge"), engines["cand"], {})
        down = await run_suite(session, "s", _suite("kind-judge"), gone, engines)
    assert nobody.cases[4].detail == "judge model no-such-judge has no ready replica"
    assert all(not c.passed and "gone-r1 could not be reached" in c.detail for c in down.cases)


def test_validate_points_at_what_would_fail_at_run_time(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Model\nmetadata: {name: m}\nspec:\n  context_length: 4096\n"
        "  rollout:\n    strategy: canary\n    canary: {duration: 1m, gates: {evals: [basics, nope]}}\n"
        "  profiles: [{name: sim, engine: sim}]\n"
    )
    (tmp_path / "e.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: EvalSuite\nmetadata: {name: basics}\nspec:\n  cases:\n"
        "    - {name: a, prompt: x, check: {regex: '(['}}\n"
        "    - {name: a, prompt: x, check: {judge: {criteria: polite}}}\n"
        "    - {name: c, prompt: x, check: {json_schema: {type: 12}}}\n"
    )
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    out = result.output
    assert result.exit_code == 1, out
    assert "e.yaml:6:" in out and "spec.cases[0].check.regex: not a regular expression" in out
    assert "spec.cases[1].name: case `a` is named twice" in out
    assert "spec.cases[1].check.judge: a judge check with no judge model (give the suite a `judge`" in out
    assert "spec.cases[2].check.json_schema: not a JSON Schema" in out
    assert "m.yaml:8:" in out and "the canary takes no traffic" in out
    assert "spec.rollout.canary.gates.evals[1]: EvalSuite `nope` is not in this repo" in out


def test_validate_refuses_a_check_with_two_kinds(tmp_path: Path) -> None:
    (tmp_path / "e.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: EvalSuite\nmetadata: {name: s}\nspec:\n  cases:\n"
        "    - {name: d, prompt: x, check: {contains: a, regex: b}}\n"
    )
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "e.yaml:6:" in result.output and "spec.cases[0].check" in result.output
