"""`llmgw validate` checks a directory source's manifest offline: the file exists in the repo, its shape, every
name (the agent's per-segment rule), a size and a sha256 per file; each problem at its file:line:col."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from llmgw.adapters.repo_files import content_hash, load_repo
from llmgw.cli.main import app

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: qwen}
spec:
  context_length: 4096
  source:
    repo: Qwen/Qwen2.5-0.5B-Instruct
    revision: 7ae557604adf67be50417f59c2c2f167def9a775
    manifest: manifests/qwen.json
  profiles: [{name: a, engine: sim}]
"""
SHA = "a" * 64
GOOD = {"format": "llmgw-manifest/1", "files": [{"name": "config.json", "size": 10, "sha256": SHA}]}


def repo(tmp_path: Path, manifest: str | None, model: str = MODEL) -> Path:
    (tmp_path / "models.yaml").write_text(model)
    if manifest is not None:
        (tmp_path / "manifests").mkdir(exist_ok=True)
        (tmp_path / "manifests" / "qwen.json").write_text(manifest)
    return tmp_path


def errors(tmp_path: Path) -> list[str]:
    result = load_repo(tmp_path)
    assert not result.ok
    return [str(e).replace(str(tmp_path) + "/", "") for e in result.errors]


def test_a_good_manifest_loads_with_the_model(tmp_path: Path) -> None:
    result = load_repo(repo(tmp_path, json.dumps(GOOD)))
    assert result.ok and result.repo is not None, [str(e) for e in result.errors]
    (only,) = result.repo.manifests["qwen"]
    assert (only.name, only.size, only.sha256) == ("config.json", 10, SHA)


def test_every_bad_entry_is_reported_at_its_line(tmp_path: Path) -> None:
    bad = """{"files": [
  {"name": "config.json", "size": 10, "sha256": "SHA"},
  {"name": "../../etc/cron.d/x", "size": 1, "sha256": "SHA"},
  {"name": "model.safetensors", "sha256": "SHA"},
  {"name": "tokenizer.json", "size": 3, "sha256": "abc"},
  {"name": "config.json", "size": 10, "sha256": "SHA"}
]}
""".replace("SHA", SHA)
    got = errors(repo(tmp_path, bad))
    assert any(e.startswith("manifests/qwen.json:3:12: files[1].name: ") and "`..`" in e for e in got), got
    assert any(
        e.startswith("manifests/qwen.json:4:3: files[2].size: a file needs its `size`") for e in got
    ), got
    assert any(
        e.startswith("manifests/qwen.json:5:51: files[3].sha256: a file needs its `sha256`") for e in got
    ), got
    assert any("files[4].name: 'config.json' is listed twice" in e for e in got), got


def test_a_missing_manifest_is_reported_at_the_model(tmp_path: Path) -> None:
    got = errors(repo(tmp_path, None))
    assert got == [
        "models.yaml:9:15: spec.source.manifest: no manifest file 'manifests/qwen.json' in the repo "
        "(a .json file inside the repo, path from its root; write it with `llmgw model manifest`)"
    ]
    outside = MODEL.replace("manifests/qwen.json", "../outside.json")
    (tmp_path.parent / "outside.json").write_text(json.dumps(GOOD))
    assert "no manifest file '../outside.json'" in errors(repo(tmp_path, None, outside))[0]


def test_a_manifest_that_is_not_one_is_said(tmp_path: Path) -> None:
    assert "manifests/qwen.json:1:1: a manifest is one JSON object" in errors(repo(tmp_path, "[1, 2]"))[0]
    assert "`files` must be a non-empty list" in errors(repo(tmp_path, '{"files": []}'))[0]
    assert "YAML syntax error" in errors(repo(tmp_path, '{"files": [}'))[0]


def test_a_manifest_on_a_single_file_source_is_refused(tmp_path: Path) -> None:
    one_file = MODEL.replace(
        "repo: Qwen/Qwen2.5-0.5B-Instruct\n    revision: 7ae557604adf67be50417f59c2c2f167def9a775",
        "url: https://example.com/qwen.gguf",
    )
    assert any(
        "`manifest` describes a directory" in e for e in errors(repo(tmp_path, json.dumps(GOOD), one_file))
    )


def test_a_repo_source_with_no_mirror_and_no_origin_is_refused(tmp_path: Path) -> None:
    cluster = "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  mirror: {origin: none}\n"
    (tmp_path / "cluster.yaml").write_text(cluster)
    got = errors(repo(tmp_path, json.dumps(GOOD)))
    assert any(
        e.startswith("models.yaml:7:11: spec.source.repo:") and "nowhere to come from" in e for e in got
    )


def test_a_manifest_edit_is_a_new_revision(tmp_path: Path) -> None:
    before = content_hash(repo(tmp_path, json.dumps(GOOD)))
    changed = {**GOOD, "files": [{**GOOD["files"][0], "size": 11}]}  # type: ignore[dict-item]
    assert content_hash(repo(tmp_path, json.dumps(changed))) != before


def test_validate_cli_prints_file_line_col(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["validate", str(repo(tmp_path, '{"files": [{"name": ".env", "size": 1}]}'))]
    )
    assert result.exit_code != 0
    assert "manifests/qwen.json:1:21: files[0].name:" in result.output


def test_a_mirror_at_a_metadata_address_is_refused(tmp_path: Path) -> None:
    cluster = "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  mirror: {url: 'http://169.254.169.254/'}\n"
    (tmp_path / "cluster.yaml").write_text(cluster)
    got = errors(repo(tmp_path, json.dumps(GOOD)))
    assert any(
        e.startswith("cluster.yaml:5:17: spec.mirror.url: http://169.254.169.254/ is refused") for e in got
    ), got
