"""Whole-repo checks of eval suites and canaries (called by `semantic.check`).

- an EvalSuite's case names are unique, its regexes compile, its JSON schemas are schemas, and a `judge`
  check has a judge: the case's or the suite's, naming a Model of the repo;
- `rollout.strategy: canary` has a `canary` block that says how traffic reaches the canary (a weight or a
  header), and the block is not given to a rolling strategy (where it would silently do nothing);
- a canary's `gates.evals` name EvalSuites of the repo.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jsonschema

from llmgw.core.config.errors import IssueAdder, PathPart
from llmgw.core.config.models import EvalSuite, Model
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_evals"]


def check_evals(documents: Sequence[object], add: IssueAdder) -> None:
    models = [d.metadata.name for d in documents if isinstance(d, Model)]
    suites = [d.metadata.name for d in documents if isinstance(d, EvalSuite)]
    for index, doc in enumerate(documents):
        if isinstance(doc, EvalSuite):
            _suite(index, doc, models, add)
        elif isinstance(doc, Model):
            _canary(index, doc, suites, add)


def _suite(index: int, doc: EvalSuite, models: list[str], add: IssueAdder) -> None:
    spec = doc.spec
    if spec.judge is not None and spec.judge not in models:
        hint = did_you_mean(spec.judge, models) or "name a Model of this repo"
        add(index, ("spec", "judge"), f"judge `{spec.judge}` is not a Model of this repo", hint)
    seen: set[str] = set()
    for i, case in enumerate(spec.cases):
        at: tuple[PathPart, ...] = ("spec", "cases", i)
        if case.name in seen:
            add(index, (*at, "name"), f"case `{case.name}` is named twice", "give each case its own name")
        seen.add(case.name)
        check = case.check
        if check.regex is not None:
            try:
                re.compile(check.regex)
            except re.error as exc:
                add(index, (*at, "check", "regex"), f"not a regular expression: {exc}", "a Python regex")
        if check.json_schema is not None:
            try:
                jsonschema.validators.validator_for(check.json_schema).check_schema(check.json_schema)
            except jsonschema.SchemaError as exc:
                add(
                    index, (*at, "check", "json_schema"), f"not a JSON Schema: {exc.message}", "a JSON Schema"
                )
        if check.judge is not None:
            judge = check.judge.model or spec.judge
            if judge is None:
                add(
                    index,
                    (*at, "check", "judge"),
                    "a judge check with no judge model",
                    "give the suite a `judge` (or the check a `model`)",
                )
            elif check.judge.model is not None and judge not in models:
                hint = did_you_mean(judge, models) or "name a Model of this repo"
                add(
                    index,
                    (*at, "check", "judge", "model"),
                    f"judge `{judge}` is not a Model of this repo",
                    hint,
                )


def _canary(index: int, doc: Model, suites: list[str], add: IssueAdder) -> None:
    rollout = doc.spec.rollout
    at: tuple[PathPart, ...] = ("spec", "rollout")
    if rollout.strategy == "canary" and rollout.canary is None:
        add(
            index,
            (*at, "canary"),
            "strategy canary without a canary block",
            "add `canary: {weight: 10, duration: 5m}` (or a `header` for internal testers)",
        )
        return
    if rollout.canary is None:
        return
    if rollout.strategy != "canary":
        add(
            index,
            (*at, "canary"),
            f"a canary block with strategy {rollout.strategy}: it would not be used",
            "write `strategy: canary`, or remove the block",
        )
    canary = rollout.canary
    if not canary.weight and canary.header is None:
        add(
            index,
            (*at, "canary"),
            "the canary takes no traffic: neither a weight above 0 nor a header",
            "give `weight` (percent of requests) or `header` (a header testers send)",
        )
    for i, name in enumerate(canary.gates.evals):
        if name not in suites:
            hint = did_you_mean(name, suites) or "name an EvalSuite of this repo"
            add(index, (*at, "canary", "gates", "evals", i), f"EvalSuite `{name}` is not in this repo", hint)
