"""`llmgw model updates` and `model update --write` against a local HTTP origin whose files change
(tests/hf_origin.py: the HF layout, and a plain file URL with a sha256 ETag). The update is a commit to a git repo;
`git revert` is the rollback and restores the old pins and checksums; an origin that stops answering is "not
checked", never "current". The rollout through a real controller and agents: test_model_updates_rollout.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hf_origin import Origin, files_of, running_origin
from typer.testing import CliRunner

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.main import app
from llmgw.core.weights.manifest import manifest_json

C1, C2 = "1" * 7 + "a" * 33, "2" * 7 + "b" * 33


@pytest.fixture
def origin() -> Iterator[Origin]:
    with running_origin() as o:
        yield o


MODELS = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: small}
spec:
  context_length: 4096
  # pinned by hand; `llmgw model update` moves it
  source: {repo: org/small, revision: 'REV', manifest: manifests/small.json}
  profiles: [{name: cpu, engine: sim}]
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: tiny}
spec:
  context_length: 4096
  source:
    url: ORIGIN/files/tiny.gguf
    sha256: SHA
    size_bytes: SIZE
  profiles: [{name: cpu, engine: sim}]
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: served}
spec:
  context_length: 4096
  source: {repo: org/small, revision: 'REV'}
  profiles: [{name: cpu, engine: sim}]
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def write_repo(tmp_path: Path, origin: Origin) -> Path:
    repo = tmp_path / "repo"
    (repo / "manifests").mkdir(parents=True)
    url = f"http://127.0.0.1:{origin.port}"
    (repo / "cluster.yaml").write_text(
        f"apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {{name: t}}\nspec:\n  mirror: {{url: '{url}', origin: '{url}'}}\n"
    )
    manifest = manifest_json(files_of(origin.commits[C1]))
    (repo / "manifests" / "small.json").write_text(json.dumps(manifest, indent=1) + "\n")
    plain = {"SHA": hashlib.sha256(origin.plain).hexdigest(), "SIZE": str(len(origin.plain)), "ORIGIN": url}
    text = MODELS.replace("REV", C1[:7])
    for key, value in plain.items():
        text = text.replace(key, value)
    (repo / "models.yaml").write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return repo


def fingerprints(repo: Path) -> dict[tuple[str, str], str]:
    loaded = load_repo(repo)
    assert loaded.repo is not None, loaded.errors
    models = loaded.repo.catalog.models
    return {(m, p.name): p.fingerprint for m, e in models.items() for p in e.profiles}


def updates(repo: Path) -> dict[str, dict[str, object]]:
    result = CliRunner().invoke(app, ["model", "updates", str(repo), "--json"])
    assert result.exit_code == 0, result.output
    return {u["model"]: u for u in json.loads(result.stdout)}


def test_updates_lists_the_change_update_writes_the_pins_and_revert_restores_them(
    tmp_path: Path, origin: Origin
) -> None:
    origin.push(C1, {"config.json": b"{}", "model.gguf": b"old weights" * 100})
    origin.plain = b"tiny v1"
    repo = write_repo(tmp_path, origin)
    before = {p: (repo / p).read_text() for p in ("models.yaml", "manifests/small.json")}
    first = fingerprints(repo)
    found = updates(repo)
    assert {u["state"] for u in found.values()} == {"current"}, found
    # This mirror publishes no origin record (llmgw-origin.json): the configured origin is asked, and said.
    said = f"{origin.url} (the Cluster's mirror.origin: the mirror records no origin for org/small@{C1[:7]})"
    assert found["small"]["origin"] == said and found["tiny"]["origin"] is None

    origin.push(C2, {"config.json": b"{}", "model.gguf": b"new weights" * 120})
    origin.plain = b"tiny v2!"
    found = updates(repo)
    assert found["small"]["state"] == "changed" and found["small"]["revision"] == C2
    assert (
        found["small"]["changed"] == ["model.gguf"]
        and "model.gguf changed upstream at" in found["small"]["detail"]
    )
    assert found["tiny"]["state"] == "changed" and found["tiny"]["changed"] == ["tiny.gguf"]
    # No manifest in the repo: the files are the ones the mirror publishes for the pinned revision.
    assert found["served"]["state"] == "changed" and found["served"]["changed"] == ["model.gguf"]

    dry = CliRunner().invoke(app, ["model", "update", "small", str(repo)])
    assert dry.exit_code == 0 and "would write" in dry.stdout and "give --write" in dry.stdout, dry.output
    assert (repo / "models.yaml").read_text() == before["models.yaml"]
    for model in ("small", "tiny", "served"):
        done = CliRunner().invoke(app, ["model", "update", model, str(repo), "--write"])
        assert done.exit_code == 0, done.output
    text = (repo / "models.yaml").read_text()
    assert (
        text.count(f"revision: '{C2}'") == 2 and "# pinned by hand" in text
    )  # edited in place, comments kept
    new_sha = hashlib.sha256(b"new weights" * 120).hexdigest()
    assert new_sha in (repo / "manifests" / "small.json").read_text()
    assert f"sha256: {hashlib.sha256(b'tiny v2!').hexdigest()}" in text and "size_bytes: 8" in text
    loaded = load_repo(repo)
    assert loaded.repo is not None, loaded.errors
    manifest = loaded.repo.catalog.models["small"].manifest
    assert manifest is not None and {f.sha256 for f in manifest} >= {new_sha}
    assert all(u["state"] == "current" for u in updates(repo).values())
    # What the plan rolls: every profile's fingerprint moved (the replicas are stale and roll per `rollout`).
    updated = fingerprints(repo)
    assert all(updated[k] != first[k] for k in first)
    again = CliRunner().invoke(app, ["model", "update", "small", str(repo)])
    assert again.exit_code == 1 and "nothing to update" in again.output

    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "update small and tiny")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "revert", "--no-edit", "HEAD")
    assert {p: (repo / p).read_text() for p in before} == before  # the old pins and checksums, byte for byte
    assert fingerprints(repo) == first  # the replicas started on the update are the stale ones now
    assert updates(repo)["small"]["state"] == "changed"  # the origin still has the new files


def test_an_origin_that_does_not_answer_is_not_checked_never_current(tmp_path: Path, origin: Origin) -> None:
    origin.push(C1, {"model.gguf": b"weights"})
    origin.plain = b"tiny"
    repo = write_repo(tmp_path, origin)
    origin.stop()
    found = updates(repo)
    assert found["small"]["state"] == "not checked" and "no answer" in str(found["small"]["detail"])
    assert found["tiny"]["state"] == "not checked"
    refused = CliRunner().invoke(app, ["model", "update", "small", str(repo), "--write"])
    assert refused.exit_code == 1 and "not checked" in refused.output
