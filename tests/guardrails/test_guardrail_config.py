"""A Guardrail in the repo: what validate says of a wrong one (file:line:col), and the chains the catalog
resolves down the tenant tree for routers."""

from __future__ import annotations

from llmgw.core.desired.repo import validate_files

from .repo import catalog, files


def test_the_catalog_resolves_guardrails_down_the_tenant_tree() -> None:
    cat = catalog()
    assert cat.project_guardrails("p1") == ("org-pii", "team-words", "p1-judge")  # organization, team, own
    assert cat.project_guardrails("p2") == ("org-pii", "p2-judge")  # directly under the organization
    assert cat.project_guardrails("p3") == ("p3-warn",)  # another organization: none of acme's
    guard = cat.published_guard()
    assert guard.enabled is True
    assert guard.projects == {
        "p1": ["org-pii", "team-words", "p1-judge"],
        "p2": ["org-pii", "p2-judge"],
        "p3": ["p3-warn"],
    }
    assert guard.models == {"sim-out": ["out-cut", "out-judge"]}


def test_the_cluster_switch_is_published() -> None:
    off = catalog(
        **{
            "cluster.yaml": "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: c}\n"
            "spec: {guardrails_enabled: false}\n"
        }
    )
    assert off.published_guard().enabled is False


BAD = """apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: bad}
spec:
  stages: [input, output]
  mode: redact
  regex: ["(unclosed"]
  judge: {model: sim-chat}
  attach:
    teams: [reserch]
    models: [nope]
"""


def test_validate_says_where_a_guardrail_is_wrong_and_what_would_be_right() -> None:
    result = validate_files(files(**{"bad.yaml": BAD}))
    assert result.repo is None
    errors = {str(e) for e in result.errors if e.file == "bad.yaml"}
    expected = {
        "bad.yaml:6:9: spec.mode: redact replaces text before the engine sees it: it cannot apply to "
        "`output` (use stages: [input] with redact, and a second Guardrail with block or warn for the output)",
        "bad.yaml:7:11: spec.regex[0]: not a regular expression: missing ), unterminated subpattern at "
        "position 0 (a Python `re` pattern)",
        "bad.yaml:8:18: spec.judge.model: model `sim-chat` is not a judge (give it `role: guard` (a Llama Guard "
        "3 model), or name one that has it)",
        "bad.yaml:10:13: spec.attach.teams[0]: team `reserch` is not defined (did you mean `research`?)",
        "bad.yaml:11:14: spec.attach.models[0]: model `nope` is not defined (a model name or alias)",
    }
    assert errors == expected


def test_plan_shows_a_guardrail_changed_added_or_removed() -> None:
    from llmgw.core.plan.diff import catalog_documents, document_changes

    from .repo import GUARDRAILS

    before = catalog_documents(catalog())
    edited = GUARDRAILS.replace("keywords: [forbidden]", "keywords: [forbidden, secret]")
    after = catalog_documents(catalog(**{"guardrails.yaml": edited}))
    [change] = [c for c in document_changes(before, after) if c.kind == "Guardrail"]
    assert (change.name, change.change) == ("team-words", "change")
    assert [f.path for f in change.fields] == ["spec.keywords"]
    removed = {k: v for k, v in after.items() if k != "Guardrail/p3-warn"}
    [gone] = [c for c in document_changes(after, removed) if c.kind == "Guardrail"]
    assert (gone.name, gone.change) == ("p3-warn", "remove")
