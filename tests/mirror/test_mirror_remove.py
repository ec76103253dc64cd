"""`llmgw mirror unused` and `mirror remove` against a cluster repo's catalog: a version a Model names by repo,
or by a URL spelled with another host and scheme, is in use; `remove` refuses it by name and deletes only what
nothing uses; an unreadable catalog makes `unused` refuse rather than call everything unused."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from llmgw.adapters.mirror import MirrorStore
from llmgw.cli.main import app

MODELS = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: by-repo}
spec:
  context_length: 4096
  source: {repo: org/a, revision: v1}
  profiles: [{name: cpu, engine: sim}]
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: by-url}
spec:
  context_length: 4096
  source: {url: 'HTTPS://Mirror.Other:8443/org/b/resolve/v2/'}
  profiles: [{name: cpu, engine: sim}]
"""


def mirror_and_repo(tmp_path: Path) -> tuple[Path, Path]:
    mirror = tmp_path / "mirror"
    for repo, revision in (("org/a", "v1"), ("org/b", "v2"), ("org/c", "v3")):
        files = tmp_path / "files" / revision
        files.mkdir(parents=True)
        (files / "model.gguf").write_bytes(revision.encode() * 1000)
        MirrorStore(mirror).add_directory(files, repo, revision)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "models.yaml").write_text(MODELS)
    return mirror, repo


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["mirror", *args])
    return result.exit_code, result.output


def test_unused_lists_only_what_no_model_names_by_repo_or_by_url_path(tmp_path: Path) -> None:
    mirror, repo = mirror_and_repo(tmp_path)
    code, out = run("unused", "--mirror-dir", str(mirror), "--cluster-repo", str(repo), "--json")
    assert code == 0, out
    assert json.loads(out) == [{"repo": "org/c", "revision": "v3", "size_bytes": 2000}]
    origins = {e.revision: e.origin for e in MirrorStore(mirror).entries()}
    assert (
        origins["v3"] == f"local directory {(tmp_path / 'files' / 'v3').resolve()}"
    )  # traced after the fact


def test_remove_refuses_what_the_catalog_uses_by_name_and_deletes_the_rest(tmp_path: Path) -> None:
    mirror, repo = mirror_and_repo(tmp_path)
    where = ["--mirror-dir", str(mirror), "--cluster-repo", str(repo)]
    code, out = run("remove", "org/b@v2", *where)
    assert code == 1 and "org/b@v2 is still used by Model/by-url" in out and "retire the entry first" in out
    on_disk = sum(p.stat().st_size for p in (mirror / "org" / "c" / "v3").iterdir())  # its manifest too
    code, out = run("remove", "org/c@v3", *where)
    assert code == 0 and f"removed org/c@v3 ({on_disk} bytes)" in out, out
    assert [(e.repo, e.revision) for e in MirrorStore(mirror).entries()] == [("org/a", "v1"), ("org/b", "v2")]
    assert not (mirror / "org" / "c").exists()  # no empty directory left behind
    code, out = run("remove", "org/c@v3", *where)
    assert code == 1 and "the mirror holds no org/c@v3" in out
    code, out = run("remove", "org-c-v3", *where)
    assert code == 1 and "give REPO@REVISION" in out
    code, out = run("unused", *where)
    assert code == 0 and "every version the mirror holds (2) is used" in out


def test_an_unreadable_catalog_is_refused_not_read_as_empty(tmp_path: Path) -> None:
    mirror, repo = mirror_and_repo(tmp_path)
    (repo / "models.yaml").write_text(
        MODELS.replace("context_length: 4096\n  source: {repo", "source: {repo")
    )
    for args in (("unused",), ("remove", "org/c@v3")):
        code, out = run(*args, "--mirror-dir", str(mirror), "--cluster-repo", str(repo))
        assert code == 1 and f"cannot read the catalog at {repo}" in out and "context_length" in out, out
    assert len(MirrorStore(mirror).entries()) == 3
