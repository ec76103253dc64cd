"""The pipeline on awkward input: every case is a list of errors at the right place, never an exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.adapters.repo_files import content_hash, load_repo
from llmgw.core.desired.repo import LoadResult, validate_files

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: NAME}
spec:
  context_length: 10
  profiles: [{name: a, engine: sim}]
"""


def model(name: str = "m") -> str:
    return MODEL.replace("NAME", name)


def errors_of(text: str | bytes, name: str = "f.yaml") -> list[str]:
    body = text.encode() if isinstance(text, str) else text
    result = validate_files({name: body})
    assert not result.ok
    return [str(e) for e in result.errors]


def test_valid_documents_and_positions() -> None:
    result = validate_files({"m.yaml": model("m").encode() + b"---\n" + model("n").encode()})
    assert result.ok and result.repo is not None
    docs = result.repo.documents
    assert [(d.kind, d.name, d.index) for d in docs] == [("Model", "m", 0), ("Model", "n", 1)]
    pos = docs[1].positions
    assert (pos.key(("spec", "context_length")).line, pos.value(("spec", "context_length")).col) == (12, 19)
    assert pos.value(("spec", "profiles", 0, "engine")).line == 13


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"\xff\xfeabc", "f.yaml:1:1: file is not valid UTF-8"),
        (b"kind: Model\nname: \xc3\x28\n", "f.yaml:2:7: file is not valid UTF-8"),
        ("- a\n- b\n", "f.yaml:1:1: a document must be a mapping, not a list"),
        ("just text\n", "f.yaml:1:1: a document must be a mapping, not a string"),
        ("42\n", "f.yaml:1:1: a document must be a mapping, not an integer"),
        ("apiVersion: llmgw/v1\nmetadata: {name: x}\n", "f.yaml:1:1: document has no `kind`"),
        ("kind: Modle\n", 'f.yaml:1:7: kind: unknown kind "Modle" (did you mean `Model`?)'),
        ("kind: [Model]\n", "f.yaml:1:7: kind: unknown kind"),
        ("kind: Model\n1: x\n", 'f.yaml:2:1: ["1"]: keys must be strings, got integer 1'),
        ("kind: Model\n? [a, b]\n: x\n", "keys must be strings, got list"),
        ("kind: Model\nx: " + "9" * 30 + "\n", "f.yaml:2:4: x: integer is out of range"),
        ("kind: Model\nx: " + "9" * 5000 + "\n", "f.yaml:1:1: cannot parse YAML"),
        ("kind: Model\nx: .inf\n", "f.yaml:2:4: x: number is not finite"),
        ("kind: Model\nx: !!binary aGVsbG8=\n", "f.yaml:2:4: x: unsupported YAML value (binary)"),
        ("kind: Model\nx: !!set {a, b}\n", "f.yaml:2:4: x: unsupported YAML value (set)"),
        ("kind: Model\nx: !custom a\n", "f.yaml:2:4: x: YAML tag `!custom` is not supported"),
        ("a: b: c\n", "f.yaml:1:5: YAML syntax error: mapping values are not allowed here"),
        ("a: 'unterminated\n", "YAML syntax error"),
        ("a: 1\na: 2\n", "f.yaml:2:1: duplicate key `a` (it is already set at line 1; keep one)"),
        ("\t- x\n", "f.yaml:1:1: YAML syntax error"),
    ],
)
def test_awkward_input_is_an_error(text: str | bytes, expected: str) -> None:
    found = errors_of(text)
    assert any(e.startswith(expected) or expected in e for e in found), found


def test_alias_expansion_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    found = errors_of("kind: Model\n" + "\n".join(lines) + "\n")
    assert any("too large" in e for e in found), found


def test_anchors_and_aliases_work_in_valid_documents() -> None:
    text = model("m").replace("profiles: [{name: a, engine: sim}]", "profiles: [&p {name: a, engine: sim}]")
    text += "---\n" + model("n").replace("profiles: [{name: a, engine: sim}]", "profiles: [*p]")
    # Anchors do not cross documents in YAML: the second document's alias is an error, not a crash.
    result = validate_files({"f.yaml": text.encode()})
    assert not result.ok
    same_doc = model("m").replace("context_length: 10", "context_length: &n 10\n  aliases: []\n  # *n reused")
    assert validate_files({"f.yaml": same_doc.encode()}).ok


def test_empty_documents_and_comment_only_files_are_skipped() -> None:
    result = validate_files(
        {"a.yaml": b"# nothing here\n", "b.yaml": b"---\n---\n" + model().encode() + b"---\n"}
    )
    assert result.ok and result.repo is not None
    assert [d.name for d in result.repo.documents] == ["m"]


def test_every_error_at_once_across_files_and_stages() -> None:
    files = {
        "a.yaml": b"a: [\n",
        "b.yaml": model("b").replace("context_length: 10", "context_lenght: 10").encode(),
        "c.yaml": model("c").replace("spec:\n", "spec:\n  fallbacks: [zzz]\n").encode(),
    }
    result = validate_files(files)
    assert [(e.file, e.line) for e in result.errors] == [("a.yaml", 2), ("b.yaml", 5), ("c.yaml", 5)]


def test_schema_failure_is_not_reported_again_by_pydantic() -> None:
    found = errors_of(model().replace("context_length: 10", "context_length: 0"))
    assert found == ["f.yaml:5:19: spec.context_length: 0 is out of range: must be at least 1"]


def test_a_second_cluster_is_refused() -> None:
    # One file cannot know about another: the whole-repo checks count Clusters.
    cluster = "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: NAME}\n"
    found = errors_of(cluster.replace("NAME", "a") + "---\n" + cluster.replace("NAME", "b"))
    assert found == ["f.yaml:6:7: kind: a second Cluster document (the first is `a`) (keep exactly one)"]


def test_reference_to_a_broken_document_is_not_reported_twice() -> None:
    files = {
        "a.yaml": model("a").replace("spec:\n", "spec:\n  fallbacks: [b]\n").encode(),
        "b.yaml": model("b").replace("context_length: 10", "context_length: x").encode(),
    }
    result = validate_files(files)
    assert [e.file for e in result.errors] == ["b.yaml"]


def test_patterns_matching_nothing_are_warnings(tmp_path: Path) -> None:
    org = "apiVersion: llmgw/v1\nkind: Organization\nmetadata: {name: acme}\nspec:\n  models: [gpt-*]\n"
    result = validate_files({"m.yaml": model().encode(), "o.yaml": org.encode()})
    assert result.ok
    assert [str(w) for w in result.warnings] == [
        "o.yaml:5:12: warning: spec.models[0]: `gpt-*` matches no model or alias"
    ]


def test_load_repo_walks_yaml_and_skips_dot_directories(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.yml").write_text(model())
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "ci.yaml").write_text("on: push\njobs: {}\n")
    (tmp_path / ".hidden.yaml").write_text("not: a document\n")
    (tmp_path / "README.md").write_text("# not yaml\n")
    result = load_repo(tmp_path)
    assert result.ok, result.errors
    assert result.files == 1
    assert result.repo is not None and result.repo.revision == content_hash(tmp_path)


def test_revision_is_a_content_hash_unless_given(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(model())
    first = load_repo(tmp_path)
    assert load_repo(tmp_path, revision="abc123").catalog is not None
    assert load_repo(tmp_path, revision="abc123").catalog.revision == "abc123"  # type: ignore[union-attr]
    (tmp_path / "m.yaml").write_text(model().replace("10", "11"))
    second = load_repo(tmp_path)
    assert isinstance(first, LoadResult) and first.repo and second.repo
    assert first.repo.revision != second.repo.revision


def test_error_file_names_include_the_given_root(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "bad.yaml").write_text("a: [\n")
    result = load_repo(tmp_path)
    assert [e.file for e in result.errors] == [str(tmp_path / "models" / "bad.yaml")]
