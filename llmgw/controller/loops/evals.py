"""Runs eval suites against one replica, straight to its engine (the decisions are llmgw.core.evals.suites).

Straight to the replica, not through a router: a canary's gate must judge exactly the canary replica, which
no router can be asked to pick, and `llmgw eval --replica R` means the same thing. The controller knows
each replica's address and derives its engine key, so no API key is needed. A judge check asks a ready
replica of the judge model the same way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import aiohttp

from llmgw.controller.status import fleet as views
from llmgw.controller.wire.engine_http import EngineTarget, post_json
from llmgw.core.config.specs.eval_spec import EvalCase, EvalSuiteSpec
from llmgw.core.errors import LlmgwError
from llmgw.core.evals.suites import (
    CaseResult,
    SuiteResult,
    answer_text,
    case_request,
    check_answer,
    judge_request,
    judge_verdict,
    suite_result,
)
from llmgw.core.security import engine_key
from llmgw.core.words import parse_duration

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import EngineCaller

log = logging.getLogger("llmgw.controller.evals")

__all__ = ["EngineTarget", "EvalError", "ready_targets", "run_suite", "target_for"]


class EvalError(LlmgwError, ValueError):
    """A suite, model or replica that cannot be evaluated (the admin API answers 400/404 with it)."""


def ready_targets(c: EngineCaller, model: str) -> list[EngineTarget]:
    """The model's ready replicas that are not stopping, oldest first."""
    out: list[EngineTarget] = []
    secret = c.cluster_secret().encode()
    for rec in sorted(c.fleet.replicas.values(), key=lambda r: (r.created_at, r.id)):
        if rec.model != model or rec.stopping or views.replica_state(c, rec) != "ready":
            continue
        shard = views.shard_status(c, rec)
        if shard is None or shard.base_url is None:
            continue
        out.append(EngineTarget(rec.id, rec.model, shard.base_url, engine_key(secret, rec.id), shard.engine))
    return out


def target_for(c: EngineCaller, model: str, replica: str | None) -> EngineTarget:
    """The replica asked for, or the model's oldest ready one; EvalError says what is missing."""
    targets = ready_targets(c, model)
    if replica is not None:
        found = next((t for t in targets if t.replica == replica), None)
        if found is None:
            ready = ", ".join(t.replica for t in targets) or "none"
            raise EvalError(f"replica {replica} of {model} is not ready (ready: {ready})")
        return found
    if not targets:
        raise EvalError(f"model {model} has no ready replica to evaluate")
    return targets[0]


async def run_suite(
    session: aiohttp.ClientSession,
    name: str,
    spec: EvalSuiteSpec,
    target: EngineTarget,
    judges: dict[str, EngineTarget],
) -> SuiteResult:
    """Every case in order against `target`; `judges` by model name (a judge check whose model has no ready
    replica fails, saying so)."""
    timeout = parse_duration(spec.timeout)
    results = [await _case(session, case, spec, target, judges, timeout) for case in spec.cases]
    result = suite_result(name, spec, results)
    log.info("eval %s on %s: %s", name, target.replica, result.words())
    return result


async def _case(
    session: aiohttp.ClientSession,
    case: EvalCase,
    spec: EvalSuiteSpec,
    target: EngineTarget,
    judges: dict[str, EngineTarget],
    timeout_s: float,
) -> CaseResult:
    response, error = await post_json(
        session, target, "/v1/chat/completions", case_request(case, target.model), timeout_s
    )
    if error is not None:
        return CaseResult(case.name, False, error, None)
    answer = answer_text(response)
    if answer is None:
        return CaseResult(case.name, False, "the answer has no text (message.content)", None)
    check = case.check
    if check.judge is None:
        ok, detail = check_answer(check, answer)
        return CaseResult(case.name, ok, detail, answer)
    judge_model = check.judge.model or spec.judge
    judge = judges.get(judge_model or "")
    if judge is None:
        return CaseResult(case.name, False, f"judge model {judge_model} has no ready replica", answer)
    verdict, error = await post_json(
        session, judge, "/v1/chat/completions", judge_request(case, check, answer, judge.model), timeout_s
    )
    ok, detail = judge_verdict(answer_text(verdict)) if error is None else (False, f"judge: {error}")
    return CaseResult(case.name, ok, detail, answer)


def judges_for(c: EngineCaller, spec: EvalSuiteSpec) -> dict[str, EngineTarget]:
    """A ready replica per judge model the suite names."""
    names = {spec.judge} | {case.check.judge.model for case in spec.cases if case.check.judge is not None}
    out: dict[str, EngineTarget] = {}
    for name in sorted(n for n in names if n):
        targets = ready_targets(c, name)
        if targets:
            out[name] = targets[0]
    return out
