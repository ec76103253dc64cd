"""Whole-repo checks of Guardrails (called by `semantic.check`):

- every regex compiles (a pattern that cannot is an error where it is written, not at the first request),
  and none backtracks catastrophically (regex_checks.py: a tenant's prompt must not cost a router minutes);
- a judge names a catalog model whose `role` is `guard`;
- what a guardrail is attached to exists (organizations, teams, projects; models by name or alias);
- `redact` is for the input: an answer already generated is blocked or warned about, never rewritten;
- `max_prompt_chars` on a guardrail that only checks output would never run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import regex

from llmgw.core.config.checks.regex_checks import backtracking_reason
from llmgw.core.config.errors import IssueAdder
from llmgw.core.config.models import Guardrail, Model, Organization, Project, Team
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_guardrails"]


def check_guardrails(documents: Sequence[object], add: IssueAdder) -> None:
    models: dict[str, Model] = {}  # name or alias -> model
    tenants: dict[str, set[str]] = {"organizations": set(), "teams": set(), "projects": set()}
    for doc in documents:
        if isinstance(doc, Model):
            models[doc.metadata.name] = doc
            models.update({alias: doc for alias in doc.spec.aliases})
        elif isinstance(doc, Organization):
            tenants["organizations"].add(doc.metadata.name)
        elif isinstance(doc, Team):
            tenants["teams"].add(doc.metadata.name)
        elif isinstance(doc, Project):
            tenants["projects"].add(doc.metadata.name)
    for index, doc in enumerate(documents):
        if isinstance(doc, Guardrail):
            _one(index, doc, models, tenants, add)


def _one(
    index: int, doc: Guardrail, models: dict[str, Model], tenants: dict[str, set[str]], add: IssueAdder
) -> None:
    _check_regexes(index, doc, add)
    _check_judge(index, doc, models, add)
    _check_attachments(index, doc, models, tenants, add)
    _check_stages(index, doc, add)


def _check_regexes(index: int, doc: Guardrail, add: IssueAdder) -> None:
    for pos, pattern in enumerate(doc.spec.regex):
        try:
            re.compile(pattern)
            # What the router searches with (a deadline; llmgw/core/evals/guardrails.py).
            regex.compile(pattern)
        except (re.error, regex.error) as err:
            add(index, ("spec", "regex", pos), f"not a regular expression: {err}", "a Python `re` pattern")
            continue
        why = backtracking_reason(pattern)
        if why is not None:
            add(
                index,
                ("spec", "regex", pos),
                f"`{pattern}` backtracks catastrophically on text that almost matches: {why}",
                "one repetition over a character class (`[\\w\\s]+`), a possessive quantifier (`\\w++`) or "
                "an atomic group (`(?>...)`)",
            )


def _check_judge(index: int, doc: Guardrail, models: dict[str, Model], add: IssueAdder) -> None:
    judge_ref = doc.spec.judge
    if judge_ref is None:
        return
    judge = models.get(judge_ref.model)
    if judge is None:
        add(
            index,
            ("spec", "judge", "model"),
            f"judge model `{judge_ref.model}` is not defined",
            did_you_mean(judge_ref.model, models) or "a Model document with `role: guard`",
        )
    elif judge.spec.role != "guard":
        add(
            index,
            ("spec", "judge", "model"),
            f"model `{judge_ref.model}` is not a judge",
            "give it `role: guard` (a Llama Guard 3 model), or name one that has it",
        )


def _check_attachments(
    index: int, doc: Guardrail, models: dict[str, Model], tenants: dict[str, set[str]], add: IssueAdder
) -> None:
    attach = doc.spec.attach
    for level in ("organizations", "teams", "projects"):
        for pos, name in enumerate(getattr(attach, level)):
            if name not in tenants[level]:
                what = level[:-1].capitalize()
                add(
                    index,
                    ("spec", "attach", level, pos),
                    f"{what.lower()} `{name}` is not defined",
                    did_you_mean(name, tenants[level]) or f"add a {what} document with that name",
                )
    for pos, name in enumerate(attach.models):
        if name not in models:
            add(
                index,
                ("spec", "attach", "models", pos),
                f"model `{name}` is not defined",
                did_you_mean(name, models) or "a model name or alias",
            )


def _check_stages(index: int, doc: Guardrail, add: IssueAdder) -> None:
    """What the mode and the prompt bound mean for the stages the guardrail checks."""
    spec = doc.spec
    if spec.mode == "redact" and "output" in spec.stages:
        add(
            index,
            ("spec", "mode"),
            "redact replaces text before the engine sees it: it cannot apply to `output`",
            "use stages: [input] with redact, and a second Guardrail with block or warn for the output",
        )
    if spec.max_prompt_chars is not None and "input" not in spec.stages:
        add(
            index,
            ("spec", "max_prompt_chars"),
            "max_prompt_chars bounds the prompt, but this guardrail checks only the output",
            "add `input` to stages, or remove max_prompt_chars",
            warning=True,
        )
