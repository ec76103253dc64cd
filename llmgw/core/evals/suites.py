"""Eval suites, pure: the request a case sends, how its answer is checked, and the suite's verdict.

The I/O shell (llmgw/controller/loops/evals.py) sends the requests and hands the answers back here; a judge
check is two requests, the case's and the judge's, and `judge_request`/`judge_verdict` are the second half.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from llmgw.core.config.specs.eval_spec import EvalCase, EvalCheck, EvalSuiteSpec

__all__ = [
    "CaseResult",
    "SuiteResult",
    "answer_text",
    "case_request",
    "check_answer",
    "judge_request",
    "judge_verdict",
    "suite_result",
]

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_VERDICT = re.compile(r"\b(PASS|FAIL)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class CaseResult:
    name: str
    passed: bool
    detail: str  # why, in words: what was expected and what came
    answer: str | None  # None: no answer (the request failed)

    def json(self) -> dict[str, Any]:
        return {"case": self.name, "passed": self.passed, "detail": self.detail, "answer": self.answer}


@dataclass(frozen=True, slots=True)
class SuiteResult:
    suite: str
    passed: bool
    score: float  # fraction of the cases that passed
    threshold: float
    cases: tuple[CaseResult, ...]

    def json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "passed": self.passed,
            "score": round(self.score, 4),
            "threshold": self.threshold,
            "cases": [c.json() for c in self.cases],
        }

    def words(self) -> str:
        good = sum(c.passed for c in self.cases)
        verdict = "passed" if self.passed else "failed"
        return f"suite {self.suite} {verdict}: {good}/{len(self.cases)} cases (threshold {self.threshold:g})"


def case_request(case: EvalCase, model: str) -> dict[str, Any]:
    """The chat completion a case sends (never streamed, temperature 0 so a rerun asks the same)."""
    messages = [] if case.system is None else [{"role": "system", "content": case.system}]
    messages.append({"role": "user", "content": case.prompt})
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": case.max_tokens,
        "temperature": 0,
    }
    if case.response_format is not None:
        body["response_format"] = case.response_format
    return body


def answer_text(response: Any) -> str | None:
    """The first choice's text of a chat completion, or None when the answer has none."""
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else None


def check_answer(check: EvalCheck, answer: str) -> tuple[bool, str]:
    """Every check but `judge` (which needs the judge's answer: `judge_verdict`)."""
    flags = re.IGNORECASE if check.ignore_case else 0
    if check.contains is not None:
        found = (
            (check.contains.lower() in answer.lower()) if check.ignore_case else (check.contains in answer)
        )
        return found, f"contains {check.contains!r}" if found else f"does not contain {check.contains!r}"
    if check.regex is not None:
        match = re.search(check.regex, answer, flags)
        return match is not None, (f"matches /{check.regex}/" if match else f"does not match /{check.regex}/")
    if check.json_schema is not None:
        return _json_check(check.json_schema, answer)
    if check.number is not None:
        return _number_check(check.number.value, check.number.tolerance, answer)
    raise ValueError("a judge check is decided by judge_verdict")


def _json_check(schema: dict[str, Any], answer: str) -> tuple[bool, str]:
    try:
        doc = json.loads(answer)
    except ValueError as exc:
        return False, f"not JSON: {exc}"
    error = jsonschema.exceptions.best_match(
        jsonschema.validators.validator_for(schema)(schema).iter_errors(doc)
    )
    if error is None:
        return True, "JSON valid against the schema"
    where = "/".join(str(p) for p in error.absolute_path) or "(the document)"
    return False, f"JSON not valid against the schema at {where}: {error.message}"


def _number_check(value: float, tolerance: float, answer: str) -> tuple[bool, str]:
    found = _NUMBER.search(answer.replace(",", ""))
    if found is None:
        return False, f"no number in the answer (expected {value:g} ± {tolerance:g})"
    got = float(found.group())
    ok = abs(got - value) <= tolerance
    return ok, f"{got:g} is {'within' if ok else 'not within'} {tolerance:g} of {value:g}"


def judge_request(case: EvalCase, check: EvalCheck, answer: str, judge_model: str) -> dict[str, Any]:
    """What the judge is asked: the prompt, the answer, the criteria, and to say PASS or FAIL."""
    assert check.judge is not None
    text = (
        "You grade an answer. Reply with one word, PASS or FAIL, then a short reason.\n"
        f"Criteria: {check.judge.criteria}\n"
        f"Question: {case.prompt}\n"
        f"Answer: {answer}"
    )
    return {
        "model": judge_model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 64,
        "temperature": 0,
    }


def judge_verdict(judge_answer: str | None) -> tuple[bool, str]:
    """The judge's first PASS or FAIL; an answer with neither is a failed case (unknown is not a pass)."""
    if judge_answer is None:
        return False, "the judge gave no answer"
    found = _VERDICT.search(judge_answer)
    if found is None:
        return False, f"the judge said neither PASS nor FAIL: {judge_answer[:120]!r}"
    ok = found.group(1).upper() == "PASS"
    return ok, f"judge: {judge_answer.strip()[:200]}"


def suite_result(name: str, spec: EvalSuiteSpec, cases: list[CaseResult]) -> SuiteResult:
    score = sum(c.passed for c in cases) / len(cases) if cases else 0.0
    return SuiteResult(
        name, bool(cases) and score >= spec.pass_threshold, score, spec.pass_threshold, tuple(cases)
    )
