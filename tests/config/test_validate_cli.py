"""`llmgw validate`: the example repo passes, each mistake of the issue fails naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cluster-repo"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["validate", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_example_repo_is_valid() -> None:
    code, out = run(str(EXAMPLE))
    assert code == 0, out
    assert "valid: 6 files" in out
    assert "5 Model" in out and "revision sha256:" in out


def test_json_output_is_machine_readable() -> None:
    code, out = run(str(EXAMPLE), "--format", "json")
    body = json.loads(out)
    assert code == 0
    assert body["valid"] is True and body["errors"] == []
    assert body["summary"]["documents"]["Model"] == 5
    assert body["summary"]["revision"].startswith("sha256:")


def test_json_output_lists_errors_with_positions() -> None:
    code, out = run(str(FIXTURES / "unknown-key"), "--format", "json")
    body = json.loads(out)
    assert code == 1 and body["valid"] is False
    [error] = body["errors"]
    assert error["file"].endswith("models/m.yaml")
    assert (error["line"], error["col"], error["path"]) == (9, 7, "spec.profiles[0].slot")
    assert error["hint"] == "did you mean `slots`?"


def test_github_format_annotates() -> None:
    code, out = run(str(FIXTURES / "min-above-max"), "--format", "github")
    assert code == 1
    assert out.startswith("::error file=")
    assert "models/m.yaml,line=8,col=10::spec.scaling.min: min 3 is above max 1" in out


def test_default_path_is_current_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLE)
    code, out = run()
    assert code == 0, out


def test_missing_path_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    code, out = run(str(tmp_path / "nope"))
    assert code == 1
    assert "no such file or directory" in out


# (fixture directory, file with the mistake, line, words of the message)
MISTAKES = [
    ("yaml-syntax", "models/m.yaml", 7, "YAML syntax error"),
    ("duplicate-key", "models/m.yaml", 6, "duplicate key `context_length`"),
    ("unknown-key", "models/m.yaml", 9, "unknown key `slot` (did you mean `slots`?)"),
    ("wrong-type", "models/m.yaml", 7, "spec.scaling.max: expected an integer"),
    ("missing-field", "models/m.yaml", 4, "missing required key `context_length`"),
    ("literal-secret", "cluster.yaml", 7, "a secret must not be written literally (write `{env: NAME}`"),
    ("duplicate-model", "models/b.yaml", 5, "model `m` is defined twice"),
    ("alias-is-model", "models/all.yaml", 15, "alias `m` is the name of model `m`"),
    ("missing-fallback", "models/m.yaml", 7, "fallback `sim-chatt` is not a model or alias"),
    ("fallback-cycle", "models/ab.yaml", 6, "fallbacks loop: a -> b -> c -> a"),
    ("sglang-without-gpu-class", "models/m.yaml", 8, "engine sglang needs a GPU"),
    ("llamacpp-tp2", "models/m.yaml", 12, "llama.cpp does not do tensor parallelism"),
    ("llamacpp-embeddings-without-flag", "models/m.yaml", 9, "serves it only when started with --embeddings"),
    ("min-above-max", "models/m.yaml", 8, "min 3 is above max 1"),
    ("on-demand-without-idle-timeout", "models/m.yaml", 7, "needs `idle_timeout`"),
]


@pytest.mark.parametrize(("fixture", "file", "line", "words"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_exits_1_naming_file_and_line(fixture: str, file: str, line: int, words: str) -> None:
    repo = FIXTURES / fixture
    code, out = run(str(repo))
    assert code == 1, out
    error_lines = [text for text in out.splitlines() if text.startswith(str(repo))]
    assert len(error_lines) == 1, out  # one mistake, reported once
    assert error_lines[0].startswith(f"{repo / file}:{line}:"), out
    assert words in error_lines[0]


def test_literal_secret_is_not_echoed() -> None:
    _, out = run(str(FIXTURES / "literal-secret"))
    _, out_json = run(str(FIXTURES / "literal-secret"), "--format", "json")
    assert "s3cr3t" not in out and "s3cr3t" not in out_json


def test_fixtures_cover_every_mistake_directory() -> None:
    assert {m[0] for m in MISTAKES} == {p.name for p in FIXTURES.iterdir() if p.is_dir()}
